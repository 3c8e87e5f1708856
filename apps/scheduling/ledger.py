"""GPU use per workspace and type, and the cohort arithmetic of borrowing and lending."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from apps.scheduling.types import Workload, WorkspaceInfo, fmt_units, units_of


class Ledger:
    """GPU use per workspace and type; what each cohort has idle to lend and has borrowed."""

    def __init__(self, workspaces: dict[str, WorkspaceInfo], borrowing: bool):
        self.workspaces = workspaces
        self.borrowing = borrowing
        self.used: dict[tuple[str, str], int] = defaultdict(int)
        self.lend: dict[tuple[str, str], int] = defaultdict(int)  # per (cohort, type)
        self.borrowed: dict[tuple[str, str], int] = defaultdict(int)
        self.nominal_of: dict[tuple[str, str], int] = {}
        self.limits_of: dict[tuple[str, str], tuple[int, int | None, int | None]] = {}
        self.cohorts: dict[str, str | None] = {}  # each workspace's cohort, looked up once
        self.version = 0  # changes with every change of use or of what is owed
        # Quota owed to owners whose work within their nominal quota waits while it is lent: not lent
        # again, so that what borrowers give back goes to the owner first. Per (cohort, type) and per
        # (workspace, type); set anew in every pass (see owe).
        self.owed: dict[tuple[str, str], int] = defaultdict(int)
        self.owed_by: dict[tuple[str, str], int] = defaultdict(int)
        # check's answers per (workspace, type, thousandths asked), with the version they hold for: a
        # pass asks the same question of many workloads while nothing changes. (remember False: every
        # answer worked out anew, as tests compare.)
        self.checked: dict[tuple[str, str, int], tuple[int, tuple[bool, int, str]]] = {}
        self.remember = True

    def workspace(self, name: str) -> WorkspaceInfo:
        return self.workspaces.get(name) or WorkspaceInfo(name)

    def _limits(self, name: str, gpu_type: str) -> tuple[int, int | None, int | None]:
        limits = self.limits_of.get((name, gpu_type))  # quotas are fixed for a ledger's life: convert once
        if limits is None:
            quota = self.workspace(name).quota(gpu_type)
            limits = self.limits_of[name, gpu_type] = (
                units_of(quota.nominal),
                None if quota.borrowing_limit is None else units_of(quota.borrowing_limit),
                None if quota.lending_limit is None else units_of(quota.lending_limit),
            )
        return limits

    def nominal(self, name: str, gpu_type: str) -> int:
        nominal = self.nominal_of.get((name, gpu_type))
        if nominal is None:
            nominal = self.nominal_of[name, gpu_type] = self._limits(name, gpu_type)[0]
        return nominal

    def _contribution(self, name: str, gpu_type: str, used: int) -> tuple[int, int]:
        nominal, _, lending_limit = self._limits(name, gpu_type)
        idle = max(0, nominal - used)
        if lending_limit is not None:
            idle = min(idle, lending_limit)
        return idle, max(0, used - nominal)

    def add(self, name: str, gpu_type: str, units: int) -> None:
        self.version += 1
        key = (name, gpu_type)
        known = key in self.used  # else its contribution is not counted yet
        used = self.used[key]
        after = self.used[key] = used + units
        cohort = self.cohorts.get(name, "")
        if cohort == "":
            cohort = self.cohorts[name] = self.workspace(name).cohort
        if cohort is None:
            return
        # What it adds to the cohort's idle to lend and to its borrowed, before and after (as _contribution).
        limits = self.limits_of.get(key) or self._limits(name, gpu_type)
        nominal, lending_limit = limits[0], limits[2]
        idle = nominal - used if known and used < nominal else 0
        idle_after = nominal - after if after < nominal else 0
        if lending_limit is not None:
            idle, idle_after = min(idle, lending_limit), min(idle_after, lending_limit)
        over = used - nominal if known and used > nominal else 0
        over_after = after - nominal if after > nominal else 0
        if idle_after != idle:
            self.lend[cohort, gpu_type] += idle_after - idle
        if over_after != over:
            self.borrowed[cohort, gpu_type] += over_after - over

    def register(self, name: str, gpu_type: str) -> None:
        """Count an idle workspace's quota as lendable before anything runs."""
        if (name, gpu_type) not in self.used:
            self.add(name, gpu_type, 0)

    def available_to_borrow(self, name: str, gpu_type: str) -> int:
        ws = self.workspace(name)
        if ws.cohort is None:
            return 0
        own_lend, own_borrowed = self._contribution(name, gpu_type, self.used[name, gpu_type])
        others_lend = self.lend[ws.cohort, gpu_type] - own_lend
        others_borrowed = self.borrowed[ws.cohort, gpu_type] - own_borrowed
        others_owed = self.owed[ws.cohort, gpu_type] - self.owed_by[name, gpu_type]
        return max(0, others_lend - others_borrowed - others_owed)

    def owe(self, name: str, gpu_type: str, units: int) -> None:
        """Work of `name` asking `units` within its nominal quota waits for quota that borrowers hold:
        until the pass ends, that much of what `name` has idle is not lent again (all of it at most)."""
        cohort = self.workspace(name).cohort
        if cohort is None or not self.borrowing:
            return
        idle = self._contribution(name, gpu_type, self.used[name, gpu_type])[0]
        more = min(units, idle - self.owed_by[name, gpu_type])
        if more > 0:
            self.owed_by[name, gpu_type] += more
            self.owed[cohort, gpu_type] += more
            self.version += 1

    def lent_out_for(self, name: str, gpu_type: str, units: int) -> bool:
        """Whether `units` more within `name`'s nominal quota would be refused because borrowers hold it."""
        used = self.used[name, gpu_type]
        return self._lent_out_after(name, gpu_type, used, used + units) > 0

    def owes_all(self, name: str, gpu_type: str) -> bool:
        """Whether all `name` has idle is owed to it already (another `owe` would change nothing)."""
        cohort = self.workspace(name).cohort
        if cohort is None or not self.borrowing:
            return True
        return self.owed_by[name, gpu_type] >= self._contribution(name, gpu_type, self.used[name, gpu_type])[0]

    def repaid(self, name: str, gpu_type: str, units: int) -> None:
        """`name` was admitted work of `units`: that much of what it was owed is no longer owed."""
        owed = self.owed_by.get((name, gpu_type), 0)
        if owed:
            paid = min(owed, units)
            self.version += 1
            self.owed_by[name, gpu_type] -= paid
            self.owed[self.workspace(name).cohort or "", gpu_type] -= paid  # owed only within a cohort

    def forget_owed(self) -> None:
        """A new pass: what is owed is worked out again from the queues."""
        self.version += 1
        self.owed.clear()
        self.owed_by.clear()

    def may_borrow(self, name: str, gpu_type: str) -> int:
        """The most a workspace may hold beyond its nominal quota now: none unless it may borrow, then
        what its cohort has idle to lend, up to its borrowing limit."""
        ws = self.workspace(name)
        if not (self.borrowing and ws.can_borrow and ws.cohort is not None):
            return 0
        borrowing_limit = self._limits(name, gpu_type)[1]
        lendable = self.available_to_borrow(name, gpu_type)
        return lendable if borrowing_limit is None else min(lendable, borrowing_limit)

    def check(self, workload: Workload, units: int) -> tuple[bool, int, str]:
        """(fits, thousandths borrowed by this admission, the reason if it does not fit)."""
        return self.check_units(workload.workspace, workload.gpu_type, units)

    def check_units(self, name: str, gpu_type: str, units: int) -> tuple[bool, int, str]:
        """`check` for `units` thousandths of `gpu_type` asked by workspace `name`."""
        key = (name, gpu_type, units)
        known = self.checked.get(key)
        if known is not None and known[0] == self.version and self.remember:
            return known[1]
        answer = self._check(*key)
        self.checked[key] = (self.version, answer)
        return answer

    def _check(self, name: str, gpu_type: str, units: int) -> tuple[bool, int, str]:
        nominal, borrowing_limit, _ = self._limits(name, gpu_type)
        used = self.used[name, gpu_type]
        after = used + units
        ws = self.workspace(name)
        if after <= nominal:
            lent_out = self._lent_out_after(name, gpu_type, used, after)
            if lent_out > 0:  # its own quota is lent: the borrowers must give it back first
                reason = (
                    f"waiting for quota: {fmt_units(lent_out)} of workspace {name}'s {fmt_units(nominal)} "
                    f"{gpu_type} are lent to others in cohort {ws.cohort}"
                )
                return False, 0, reason
            return True, 0, ""
        reason = (
            f"waiting for quota: {fmt_units(used)} of {fmt_units(nominal)} {gpu_type} in use "
            f"in workspace {name}, this needs {fmt_units(units)}"
        )
        if not (self.borrowing and ws.can_borrow and ws.cohort is not None):
            return False, 0, reason
        over = after - nominal
        if borrowing_limit is not None and over > borrowing_limit:
            return False, 0, f"{reason} (borrowing limit {fmt_units(borrowing_limit)})"
        lendable = self.available_to_borrow(name, gpu_type)
        if over > lendable:
            left = max(0, lendable - max(0, used - nominal))
            return False, 0, f"{reason}; cohort {ws.cohort} has {fmt_units(left)} idle to lend"
        return True, over - max(0, used - nominal), ""

    def _lent_out_after(self, name: str, gpu_type: str, used: int, after: int) -> int:
        """How much more the cohort's borrowers hold than it could lend once `name` uses `after`."""
        cohort = self.workspace(name).cohort
        if cohort is None or not self.borrowing:
            return 0
        lend = self.lend[cohort, gpu_type]
        lend += self._contribution(name, gpu_type, after)[0] - self._contribution(name, gpu_type, used)[0]
        return self.borrowed[cohort, gpu_type] - lend

    def most_lent(self, name: str, gpu_type: str) -> int:
        """The most a workspace lends when it uses nothing."""
        return self._contribution(name, gpu_type, 0)[0]

    def ceiling(self, name: str, gpu_type: str, cohort_lendable: Mapping[tuple[str, str], int]) -> int:
        """The most a workspace could ever hold: nominal plus all it could ever borrow."""
        nominal, borrowing_limit, _ = self._limits(name, gpu_type)
        ws = self.workspace(name)
        if not (self.borrowing and ws.can_borrow and ws.cohort is not None):
            return nominal
        others = cohort_lendable.get((ws.cohort, gpu_type), 0) - self.most_lent(name, gpu_type)
        return nominal + (others if borrowing_limit is None else min(others, borrowing_limit))
