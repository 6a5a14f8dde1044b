"""Run kernels joined with their matched counters: the run's names, durations and owning ops,
and no join where a stored link no longer points at the kernel it was matched with."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from tessera_tb.backend.counter_join import counter_instances
from tessera_tb.importers.kernel_names import kernel_name_key
from tessera_tb.importers.ncu_attach import import_ncu
from tessera_tb.trace import open_run
from tessera_tb.trace.kernel_counters import load_kernel_counters, write_kernel_counters
from tests.conftest import DEMO_RUNS, SHARED_TRACES

GPT = os.path.join(SHARED_TRACES, "ncu", "gpt_step_raw.csv")


@pytest.fixture()
def run_dir(tmp_path):
    dest = tmp_path / "gpt_1gpu"
    shutil.copytree(os.path.join(DEMO_RUNS, "gpt_1gpu"), dest)
    import_ncu(GPT, str(dest), overwrite=True)
    return str(dest)


def test_each_instance_is_the_run_kernel_with_its_own_duration(run_dir):
    run = open_run(run_dir)
    frame = counter_instances(run, ["gpu__time_duration.sum"])
    profile = load_kernel_counters(run_dir, "worker0")
    assert len(frame) == int((profile.row >= 0).sum()) == 98
    for step_num, part in frame.groupby("step"):
        step = run.load_step("worker0", step_num)
        rows = part["row"].to_numpy()
        np.testing.assert_array_equal(part["dur_ns"], step.events["dur_ns"][rows])
        names = step.string_values(step.events["name_id"][rows])
        profiled = profile.kernel_names[part["profile_index"].to_numpy()]
        assert [kernel_name_key(n) for n in names] == [kernel_name_key(n) for n in profiled]
    assert (
        frame.loc[frame["kernel_name"].str.startswith("nvjet"), "op_name"]
        .isin(["aten::addmm", "aten::mm"])
        .all()
    )


def test_links_that_point_at_other_kernels_are_not_joined(run_dir):
    profile = load_kernel_counters(run_dir, "worker0")
    linked = profile.row >= 0
    profile.row[linked] += 1  # as if the step files had been re-imported differently
    write_kernel_counters(run_dir, profile)
    frame = counter_instances(open_run(run_dir), ["gpu__time_duration.sum"])
    run = open_run(run_dir)
    for step_num, part in frame.groupby("step"):
        step = run.load_step("worker0", step_num)
        names = step.string_values(step.events["name_id"][part["row"].to_numpy()])
        profiled = profile.kernel_names[part["profile_index"].to_numpy()]
        assert [kernel_name_key(n) for n in names] == [kernel_name_key(n) for n in profiled]
    assert len(frame) < 98
