"""Who may decide a call, how many must, and whether the requester may: one value.

A :class:`ReviewerRule` is made once (the process's default from the settings, or a
policy rule's from ``opsloop.yaml``), recorded with the call, carried whole by the
pending call, and asked at every click: approve, reject, the reconcile buttons, cancel.
``policy check`` compares two of them with :meth:`ReviewerRule.compared_to`.

Pure: no I/O here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

Comparison = Literal["same", "stricter", "looser", "different"]


@dataclass(frozen=True)
class ReviewerRule:
    """``approvers``: user ids (U…/W…), user-group ids (S…) and ``oncall:<id>``; empty
    means anyone but the requester. ``quorum`` distinct people must approve; the
    requester's own vote counts only with ``allow_self``. ``rule`` is the index of the
    ``opsloop.yaml`` rule that set it (None: the defaults)."""

    approvers: frozenset[str] = frozenset()
    quorum: int = 1
    allow_self: bool = False
    rule: int | None = None

    @property
    def groups(self) -> frozenset[str]:
        return frozenset(a for a in self.approvers if a.startswith("S"))

    @property
    def on_call(self) -> bool:
        """Does it name an on-call schedule or escalation policy (``oncall:<id>``)?"""
        return any(a.startswith("oncall:") for a in self.approvers)

    @property
    def looked_up(self) -> frozenset[str]:
        """The entries only a lookup can match: user groups (who is in them) and
        ``oncall:`` entries (who is on call now)."""
        return frozenset(a for a in self.approvers if a.startswith(("S", "oncall:")))

    def is_approver(self, user: str, user_groups: Iterable[str] = ()) -> bool:
        """``user_groups``: the looked-up entries that hold ``user`` (the groups they
        are in, the schedules they are on call for), as the front door resolved them."""
        if not self.approvers:
            return True
        return user in self.approvers or bool(self.looked_up & set(user_groups))

    def may_decide(
        self,
        decision: Literal["approve", "reject"],
        reviewer: str,
        requester: str | None,
        reviewer_groups: Iterable[str] = (),
    ) -> str | None:
        """None if ``reviewer`` may make ``decision``; otherwise why not, in a sentence.

        Rejecting is always open to the requester (withdrawing their own request is
        safe); approving never is, unless self-approval is allowed.
        """
        is_requester = reviewer == requester
        if decision == "reject" and is_requester:
            return None
        if is_requester and not self.allow_self:
            return "you asked for this call, and self-approval is turned off"
        if not self.is_approver(reviewer, reviewer_groups):
            if self.on_call:
                return "you are not on the approvers list, nor on call for it now"
            return "you are not on the approvers list"
        return None

    def met(self, votes: Iterable[str], requester: str | None) -> bool:
        """Have ``quorum`` distinct people approved? The requester never counts, unless
        ``allow_self`` (then their own vote counts once, as anyone's)."""
        people = set(votes)
        if not self.allow_self:
            people.discard(requester or "")
        return len(people) >= self.quorum

    def compared_to(self, old: ReviewerRule) -> set[Comparison]:
        """How this rule differs from ``old``, one step per part that differs: a wider or
        emptied approvers set, a lower quorum or self-approval turning on is looser."""
        steps = {
            _approvers_step(old.approvers, self.approvers),
            direction(self.quorum - old.quorum),
            direction(int(old.allow_self) - int(self.allow_self)),
        }
        steps.discard("same")
        return steps

    def widens(self, old: ReviewerRule) -> bool:
        """Could someone decide under this rule who could not under ``old``?"""
        return bool(self.compared_to(old) & {"looser", "different"})


def direction(delta: float) -> Comparison:
    """A positive delta is stricter."""
    return "stricter" if delta > 0 else "looser" if delta < 0 else "same"


def _approvers_step(old: frozenset[str], new: frozenset[str]) -> Comparison:
    """An empty set means anyone but the requester: the widest."""
    if old == new:
        return "same"
    if not new:
        return "looser"
    if not old:
        return "stricter"
    if old < new:
        return "looser"
    if new < old:
        return "stricter"
    return "different"


# No approvers named, quorum 1: anyone but the requester decides (the process's rule when
# OPSLOOP_APPROVERS is empty). A module-level value, for defaults.
ANYONE = ReviewerRule()
