"""Head-to-head rounds: a separation that alone keeps a configuration out of rank 1 is
measured again, the two sides alternately (A, B, A, B), each point on a fresh server,
so that a drift over minutes falls on both sides of the comparison. Resumable mid-rounds:
the state file keeps the rounds under way."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness.peak.config import PeakConfig
from harness.peak.outcomes import Point
from harness.peak.tune.ranking import FAILED, config_result, contested, evidence, status
from harness.peak.tune.space import Config, TuneConfig, key
from harness.peak.tune.state import H2H_OPEN, STATE, State


class HeadToHeadRounds:
    """The rounds, as a part of ``Tuner`` (its state file, results and way to measure)."""

    tc: TuneConfig
    state: State
    results: dict[str, dict[str, Any]]
    show: Callable[[str], None]
    measure_at: Callable[[Config, PeakConfig, float, int], Point] | None
    _replay: list[tuple[str, Point]]
    out_dir: Path

    def cmd(self, cfg: Config) -> str:
        raise NotImplementedError

    def evaluate(self, cfg: Config, hint_rps: float | None) -> dict[str, Any]:
        raise NotImplementedError

    def _add_point(self, cfg: Config, p: Point) -> None:
        """A head-to-head point joins the configuration's evidence; its result is redone."""
        k = key(cfg)
        self.state.add_point(k, p)
        self.state.finish(k, self._evidence_now(k))

    def _evidence_now(self, k: str) -> dict[str, Any]:
        """``k``'s result on its points in the state file, less those of a resumed head to
        head not yet given back (``_resume_rounds``)."""
        pts = self.state.points(k)
        pts = pts[: len(pts) - sum(1 for k2, _ in self._replay if k2 == k)]
        old = self.results[k]
        cfg = self.tc.space.parse_config(k, "--default")
        res = config_result(
            cfg,
            pts,
            old["stopped"],
            self.cmd(cfg),
            old.get("floor_rps"),
            self.tc.peak.repeats,
            self.tc.peak.tolerance,
            old.get("max_points") or self.tc.peak.max_points,
            search_limit=old.get("limit"),
        )
        self.results[k] = res
        return res

    def _head_to_head(self, final: bool = False) -> None:
        """Settle each contested separation (``contested``) by measuring the two sides
        alternately, each point on a fresh server: the worse one at the rate it missed
        from, then the better one at the rate it held, ``repeats`` rounds — A, B, A, B, so
        that a drift over minutes falls on both sides of the comparison, not on one side's
        whole evidence. The points join each side's evidence: a separation the
        interleaved rounds reproduce (the worse one missed, the better one met, every
        round) stands; one they do not is no longer a separation (the worse one met where
        it had missed, or the better one missed where it had held) and the two share a
        rank. Each pair is settled once; the outcome is kept in the state file."""
        pm = self.tc.prune_margin
        band = pm / (1 - pm)  # r missed from at least (1 - prune_margin) x what h held
        tol = self.tc.peak.tolerance
        settled = self.state.data.setdefault("head_to_head", [])
        done = {(c["better"], c["worse"]) for c in settled}
        while True:
            rec = self.state.data.get(H2H_OPEN)
            if rec is not None:  # a tune killed mid-rounds: the same rounds, from where they were
                if any(k not in self.results for k in rec["base"]):
                    if not final:
                        return  # the resumed climb has not come back to where they ran
                    for k in rec["base"]:
                        self.evaluate(self.tc.space.parse_config(k, "--default"), None)
                r, missed = rec["worse"], float(rec["missed_rps"])
                pairs = [(h, float(held), missed) for h, held in rec["pairs"]]
                self._resume_rounds(rec)
                self.show(
                    f"    head to head resumed: {r} against {', '.join(h for h, _, _ in pairs)}"
                    f" ({len(self._replay)} points from {STATE})"
                )
            else:
                todo = {
                    r: [b for b in better if (b[0], r) not in done]
                    for r, better in contested(list(self.results.values()), tol, band).items()
                }
                todo = {r: b for r, b in todo.items() if b}
                if not todo:
                    return
                if self.measure_at is None:
                    raise RuntimeError("a simulated measure needs a simulated measure_at")
                r = max(todo, key=lambda k: (float(self.results[k]["peak_rps"] or 0.0), k))
                pairs = todo[r]
                missed = pairs[0][2]
                self.show(
                    f"    head to head: {r} missed from {missed:.1f} req/s, "
                    + ", ".join(f"{h} held {held:.1f}" for h, held, _ in pairs)
                    + f" — {self.tc.peak.repeats} alternating rounds, each on a fresh server"
                )
                # kept before the first point: a kill mid-rounds resumes these rounds
                self.state.note(
                    **{
                        H2H_OPEN: {
                            "worse": r,
                            "missed_rps": missed,
                            "pairs": [[h, held] for h, held, _ in pairs],
                            # each side's points before the rounds, and the rounds' order
                            "base": {
                                k: len(self.state.points(k)) for k in [r, *(h for h, _, _ in pairs)]
                            },
                            "taken": [],
                        }
                    }
                )

            def apart(h: str, r: str = r) -> bool:
                if FAILED in (status(self.results[h]), status(self.results[r])):
                    return False  # a server died in the rounds: that configuration failed
                held, _ = evidence(self.results[h])
                missed_from = evidence(self.results[r])[1]
                return (
                    held is not None and missed_from is not None and held >= missed_from * (1 + tol)
                )

            rounds = 0
            for _ in range(self.tc.peak.repeats):
                live = [(h, held) for h, held, _ in pairs if apart(h)]
                if not live:
                    break
                ok = self._point_at(r, missed) == "missed"
                for h, held in live:
                    if not apart(h):
                        break
                    ok = self._point_at(h, held) == "met" and ok
                rounds += ok
            self._give_back()
            for h, held, _ in pairs:
                rec = {
                    "better": h,
                    "worse": r,
                    "held_rps": held,
                    "missed_rps": missed,
                    "stands": apart(h),
                    "rounds_reproduced": rounds,
                    # a side whose server died during the rounds (then it failed)
                    "failed": [k for k in (h, r) if status(self.results[k]) == FAILED],
                }
                settled.append(rec)
                done.add((h, r))
                self.show(
                    f"    → {h} over {r}: "
                    + (
                        f"{', '.join(rec['failed'])} failed: its server died in the rounds"
                        if rec["failed"]
                        else "stands (reproduced in alternating rounds)"
                        if rec["stands"]
                        else "not reproduced: not separated"
                    )
                )
            self.state.data.pop(H2H_OPEN, None)
            self.state.save()

    def _resume_rounds(self, rec: Mapping[str, Any]) -> None:
        """The rounds' points, already in the state file, are held back from each side's
        evidence and given back one by one in the order they were measured (``_point_at``):
        the rounds' decisions — which side is still apart, whether a round reproduced the
        separation — are then made on the evidence each side had at that point of the
        rounds, as in a tune never killed, and only the rounds' missing points are
        measured. Nothing is taken out of the state file: a second kill loses nothing."""
        taken = {k: self.state.points(k)[n:] for k, n in rec["base"].items()}
        self._replay = []
        for k in rec["taken"]:  # in the order measured (a point and its entry: one save)
            if taken.get(k):
                self._replay.append((k, taken[k].pop(0)))
        for k in rec["base"]:
            self._evidence_now(k)

    def _point_at(self, k: str, rate: float) -> str:
        cfg = self.tc.space.parse_config(k, "--default")
        p = None
        for _ in range(2):  # an invalid point (the box was the limit) is tried once more
            if (
                self._replay
                and self._replay[0][0] == k
                and math.isclose(self._replay[0][1].rate_rps, rate)
            ):
                p = self._replay.pop(0)[1]  # measured before the kill: given back
                self._evidence_now(k)
                self.show(
                    f"      {k} at {rate:.1f} req/s (lifetime {p.lifetime}): {p.outcome}"
                    f" (from {STATE})"
                )
            else:
                self._give_back()
                pts = self.state.points(k)
                lifetime = max((p.lifetime or 1 for p in pts), default=0) + 1
                assert self.measure_at is not None
                p = replace(self.measure_at(cfg, self.tc.peak, rate, lifetime), lifetime=lifetime)
                self.state.data[H2H_OPEN]["taken"].append(k)
                self._add_point(cfg, p)  # one save: the point and its place in the rounds
                self.show(f"      {k} at {rate:.1f} req/s (lifetime {lifetime}): {p.outcome}")
            if p.outcome != "invalid":
                break
        assert p is not None
        return p.outcome

    def _give_back(self) -> None:
        """Every point a resumed head to head still holds back joins its side's evidence
        (the rounds ended; or they took another turn than before the kill, which the same
        decisions on the same evidence cannot — kept all the same: nothing measured is
        dropped)."""
        held_back = {k for k, _ in self._replay}
        self._replay = []
        for k in held_back:
            self.state.finish(k, self._evidence_now(k))
