"""How the capsule budget is split between capsule records and KV log pages.

Every step on one timeline costs one record (the small state, ~10 KiB at the default model) and one
KV entry per layer (n_layers x 2 x d_model x 4 B = 4 KiB), so the budget holds about
budget / (record + entry) steps of rollback, whatever the attention window: the window itself is
stored once and shared. Fixed reserves keep the live step and a replan able to run whatever is
pinned.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..model.buffers import layout
from ..model.config import PolicyConfig
from ..model.kernels import KV_PAGE, window_pages
from ..model.policy import HybridPolicy


@dataclass(frozen=True)
class StoreSizes:
    budget_bytes: int
    record_nbytes: int  # one capsule's small state
    entry_nbytes: int  # one position's K and V over all layers
    records: int  # capsule records
    log_pages: int  # pages of KV_PAGE entries
    reserve_records: int  # never taken by pins: the live step's capsule and a replan's branch capsules
    reserve_pages: int  # never taken by pins: the live window (+1 for copy-on-write) and 2 per branch

    @property
    def rollback_depth_steps(self) -> int:
        """Steps of one timeline the store keeps restorable once it is full (capsule every step)."""
        entries_for_capsules = self.log_pages * KV_PAGE - self.window_entries - 2 * KV_PAGE
        return max(0, min(self.records - self.reserve_records, entries_for_capsules))

    window_entries: int = 0

    @classmethod
    def plan(cls, cfg: PolicyConfig) -> StoreSizes:
        specs = HybridPolicy(cfg).state_specs()
        record = layout(specs, 1)[1]["row"]
        entry = cfg.n_layers * 2 * cfg.d_model * 4
        page = KV_PAGE * entry
        budget = int(cfg.capsule_budget_mb * 2**20)
        window_slots = window_pages(cfg.kv_window)
        reserve_records = 1 + cfg.max_branches
        reserve_pages = window_slots + 1 + 2 * cfg.max_branches
        if cfg.capsule_capacity:
            records = cfg.capsule_capacity
            if records < reserve_records + 1:  # the records alone are too few, whatever the budget
                raise ValueError(f"capsule_capacity: {records} is below the {reserve_records + 1} capsule records a "
                                 f"store needs: one for the live step, {cfg.max_branches} for a replan's branches "
                                 f"(max_branches {cfg.max_branches}) and one to roll back to. Set capsule_capacity "
                                 f">= {reserve_records + 1}, 0 (as many as capsule_budget_mb holds), or lower "
                                 "max_branches")
        else:  # records and pages run out together on one timeline: one of each per step
            fixed = (reserve_pages + window_slots) * page  # exactly the pages the check below needs
            records = max(0, (budget - fixed) // (record + entry))
        log_pages = (budget - records * record) // page
        need_pages = reserve_pages + window_slots
        if records < reserve_records + 1 or log_pages < need_pages:
            need = max(reserve_records + 1, records) * record + need_pages * page
            asked = " (capsule_capacity)" if cfg.capsule_capacity else ""
            raise ValueError(f"capsule_budget_mb: {cfg.capsule_budget_mb:g} MB cannot hold {records} capsule records"
                             f"{asked} of {record} B and the {need_pages} KV log pages of {page / 2**20:.2f} MB that "
                             f"kv_window {cfg.kv_window} and max_branches {cfg.max_branches} need (at least "
                             f"{need / 2**20:.1f} MB)")
        return cls(budget, record, entry, records, log_pages, reserve_records, reserve_pages, cfg.kv_window)
