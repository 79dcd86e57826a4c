"""The named mutations `make mutate` applies (scripts/mutate.py), one at a time, each with the tests
that must catch it. `old` must occur exactly once in `file`."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutation:
    name: str
    file: str
    old: str
    new: str
    tests: list[str]
    why: str


RT = "flashrt_ros/runtime/"

MUTATIONS = [
    Mutation("twin_allocates_per_step", RT + "kernels.py",
             "    np.matmul(x[:, None, :], w, out=y[:, None, :])\n    y += b\n",
             "    y[...] = (x[:, None, :] @ w)[:, 0] + b\n",
             ["test/test_plan_and_config.py::test_replay_allocates_no_arrays_whatever_the_model_size"],
             "a twin that allocates a temporary each step (a CUDA graph cannot)"),
    Mutation("attention_grid_from_host_kv_len", RT + "launch.py",
             "    return (Launch(\"attention.cu\", \"attn_partial_f32\", (B * n_heads, P, 1),",
             "    P = min(P, int(meta[0, 2]) // KV_PAGE + 2)  # sized on the host: a graph freezes it\n"
             "    return (Launch(\"attention.cu\", \"attn_partial_f32\", (B * n_heads, P, 1),",
             ["test/test_capture_discipline.py"],
             "the attention grid sized from kv_len read on the host, which a graph freezes"),
    Mutation("noise_seed_varies_per_step", RT + "launch.py",
             "(action, rs(action), meta, rs(meta), I32(B), I32(A), U32(seed & 0xFFFFFFFF), F32(std))",
             "(action, rs(action), meta, rs(meta), I32(B), I32(A), U32((seed + int(meta[0, 3])) & 0xFFFFFFFF), "
             "F32(std))",
             ["test/test_capture_discipline.py"],
             "a noise seed taken from the step counter on the host"),
    Mutation("finite_check_before_cast", RT + "inputs.py",
             "    with np.errstate(over=\"ignore\"):\n        f = np.ascontiguousarray(a, dtype=np.float32)\n"
             "    bad = ~np.isfinite(f)",
             "    with np.errstate(over=\"ignore\"):\n        f = np.ascontiguousarray(a, dtype=np.float32)\n"
             "    bad = ~np.isfinite(a)",
             ["test/test_session_contracts.py"],
             "1e300 passes a float64 finiteness check and becomes inf in float32"),
    Mutation("no_copy_on_write", RT + "kv_log.py",
             "if slot and page >= 0 and self.fill[page] == slot and (extend_shared or self.refs[page] == 1):",
             "if slot and page >= 0:",
             ["test/test_determinism.py", "test/test_replan.py", "test/test_capsule_oracle.py"],
             "appending into a page another timeline wrote past: a capsule's KV entries change"),
    Mutation("eviction_ignores_pins", RT + "capsule.py",
             "            victim = next((cid for cid, c in self._caps.items() if not c.info.pinned), None)",
             "            victim = next(iter(self._caps), None)",
             ["test/test_bad_inputs.py", "test/test_capsule_store.py", "test/test_capsule_oracle.py"],
             "the oldest capsule is evicted even when pinned"),
    Mutation("what_ifs_evicted_like_the_timeline", RT + "capsule.py",
             "        victim = next((cid for cid in self._what_ifs if not self._caps[cid].info.pinned), None)",
             "        victim = None",
             ["test/test_capsule_oracle.py::test_what_if_branches_are_evicted_before_the_timeline_loses_depth"],
             "replan what-ifs evicted in plain age order: every what-if eats the timeline's rollback depth"),
    Mutation("branches_extend_the_live_page", RT + "replan.py",
             "session.kv.prepare_append(r, base_step + t, extend_shared=False)",
             "session.kv.prepare_append(r, base_step + t)",
             ["test/test_capsule_oracle.py::test_what_if_branches_are_evicted_before_the_timeline_loses_depth"],
             "a branch appends into the live row's page, forcing the live row into a copy of it"),
    Mutation("no_room_check_before_evicting", RT + "capsule.py",
             "        if pages_needed > have:",
             "        if False:",
             ["test/test_session_contracts.py::test_a_replan_or_import_that_cannot_fit_is_refused_before_it_evicts_anything"],
             "an import or replan that cannot fit evicts every unpinned capsule first, then fails"),
    Mutation("failed_on_action_skips_bookkeeping", RT + "session.py",
             "            self._step += 1  # the step ran: its bookkeeping and capsule follow whatever on_action does\n"
             "            self.history.push(o, self._step)\n            cid = 0\n            try:\n"
             "                if on_action is not None:\n                    on_action(action)\n"
             "            finally:\n",
             "            if on_action is not None:\n                on_action(action)\n"
             "            self._step += 1\n            self.history.push(o, self._step)\n            cid = 0\n"
             "            if True:\n",
             ["test/test_session_contracts.py::test_a_failing_on_action_callback_still_leaves_a_consistent_state_and_no_capsule_is_touched"],
             "an on_action error leaves the live row a step ahead of the bookkeeping: the next append misses its copy"),
    Mutation("pin_admission_unchecked", RT + "capsule.py",
             "        if len(pinned) + 1 > self.capacity - self.reserve_records:",
             "        if False:",
             ["test/test_bad_inputs.py", "test/test_session_contracts.py", "test/test_capsule_oracle.py"],
             "pins may take the live step's reserve"),
    Mutation("cancelled_replan_commits", RT + "replan.py",
             "committed = commit_branch is not None and not cancelled",
             "committed = commit_branch is not None",
             ["test/test_session_contracts.py"],
             "a cancelled replan still commits its half-finished branch"),
    Mutation("import_skips_meta_invariants", RT + "capsule_file.py",
             "        check_meta(tensors[\"meta\"], info[\"step\"], kv_window)\n",
             "",
             ["test/test_capsule_files.py"],
             "a capsule with kv_len = -1 (or any broken meta) imports"),
    Mutation("metadata_outside_checksum", RT + "capsule_file.py",
             "    fields = {k: meta.get(k) for k in (\"format\", \"info\", \"fingerprint\", \"state_sha256\")}",
             "    fields = None",
             ["test/test_capsule_files.py"],
             "the checksum covers the state but not the metadata"),
    Mutation("signed_kv_write_index", "kernels/attention.cu",
             "  const u64 pos = (u64)meta[b * meta_rs + META_POS];\n"
             "  const u64 page = log_page(kv_pages + b * pages_rs, (pos / KV_PAGE) % (u64)P, (u64)n_pages);\n"
             "  const u64 at = (page * KV_PAGE + pos % KV_PAGE) * (u64)d + c;",
             "  const i64 pos = meta[b * meta_rs + META_POS];\n"
             "  const u64 page = log_page(kv_pages + b * pages_rs, (u64)((pos / KV_PAGE) % P), (u64)n_pages);\n"
             "  const i64 at = ((i64)page * KV_PAGE + pos % KV_PAGE) * (i64)d + c;",
             ["test/test_kernels_shim.py"],
             "slot = pos % W with a signed pos: a negative position writes before the log"),
    Mutation("policy_step_stamped_at_receive", "flashrt_ros/ros/node.py",
             "            header=Header(stamp=stamp, frame_id=",
             "            header=Header(stamp=self.get_clock().now().to_msg(), frame_id=",
             ["test/test_ros_node.py::test_each_observation_steps_once_in_order_with_increasing_capsules"],
             "PolicyStep stamped with the receive time instead of the observation's stamp"),
    Mutation("held_observation_dropped_at_replan_end", "flashrt_ros/ros/replan_server.py",
             "                msg = self._msgs.popleft()\n            step(msg)\n",
             "                msg = self._msgs.popleft()\n            del msg\n",
             ["test/test_live_gate.py"],
             "an observation held during the last batched step is dropped when the replan ends"),
    Mutation("held_observation_waits_for_the_replan", "flashrt_ros/ros/replan_server.py",
             "            for msg in self.gate.take():  # the live step waits at most one batched step\n"
             "                self._step_held(msg)",
             "            pass",
             ["test/test_faults.py::test_observations_held_during_a_replan_are_stepped_in_order_before_it_ends_and_counted"],
             "held observations wait for the whole replan instead of one batched step"),
    Mutation("replay_check_always_passes", "flashrt_ros/tools/replay_stream.py",
             "        self.passed += int(ok)",
             "        self.passed += 1",
             ["test/test_replay.py::test_a_rollback_check_fails_when_the_re_fed_actions_differ_by_one_bit"],
             "a replay rollback check that passes whatever it compared"),
    Mutation("resume_skips_delta_entries", RT + "resume.py",
             "        kv.write_entry(0, pos, rec.kv[i])\n",
             "",
             ["test/test_persist.py::test_resume_restores_the_newest_capsule_byte_exactly_and_continues_identically"],
             "resume appends a DELTA's positions without writing its KV entries"),
    Mutation("delta_after_a_jump", RT + "persist.py",
             "        return (self.need_resync or parent_id != self.last_id or parent_id == 0\n",
             "        return (self.need_resync or parent_id == 0\n",
             ["test/test_persist.py::test_resume_restores_the_newest_capsule_byte_exactly_and_continues_identically"],
             "after a rollback the next record is a DELTA on the wrong parent's window"),
    Mutation("segment_starts_with_a_delta", RT + "persist.py",
             "        self._resync_next = True  # every segment starts with a record that stands alone\n",
             "",
             ["test/test_persist.py::test_retention_keeps_the_log_within_its_budget_and_pins_longest"],
             "a segment that starts with a DELTA cannot be read once the segment before it is removed"),
    Mutation("record_checksum_ignored", RT + "persist_format.py",
             "    if zlib.crc32(payload, zlib.crc32(struct.pack(\"<BI\", kind, n))) != crc:\n",
             "    if False:\n",
             ["test/test_persist.py::test_a_flipped_byte_in_the_last_record_is_cut_and_in_an_older_needed_segment_refused"],
             "a flipped byte inside a record is loaded as state"),
    Mutation("prefill_attention_sees_keys_older_than_the_window", RT + "prefill.py",
             "        if old > 0:\n",
             "        if old > 10**9:\n",
             ["test/test_prefill.py"],
             "the chunked prefill attention forgets the window's lower edge"),
    Mutation("gru_scan_kernel_single_buffered_h", "kernels/recurrent.cu",
             "      h[(t + 1) & 1][j] = hn;",
             "      h[t & 1][j] = hn;",
             ["test/test_kernels_shim.py::test_gru_scan_kernel_matches_the_stepwise_scan"],
             "the persistent GRU scan overwrites h while other lanes of the same step still read it"),
    Mutation("rollback_not_recorded", RT + "session.py",
             "                self.persistence.on_live(info)\n",
             "                pass\n",
             ["test/test_persist_attack.py::test_a_rollback_followed_by_a_crash_resumes_the_rolled_back_state"],
             "a rollback writes no marker: a crash before the next step resumes past the rollback"),
    # issue 15 (h15ros)
    Mutation("rollback_without_target_accepted", "flashrt_ros/ros/services.py",
             "        if not request.capsule_id and not request.steps_back:\n",
             "        if False:\n",
             ["test/test_ros_safe_defaults.py::test_a_rollback_request_that_names_no_target_is_refused_and_changes_nothing"],
             "an empty Rollback request ({}) moves the robot back to the last capsule"),
]
