"""The order test workers take their work in: the longest first.

With ``--dist loadgroup`` pytest-xdist hands each worker the next unit of work (one test, or
every test of an ``xdist_group``) in collection order, and a unit given to a worker stays
there. A long unit that comes late leaves the other worker idle at the end of the run, so
the units are put in order of their expected seconds, longest first (LPT), and xdist's own
reordering (by test count) is turned off. A unit's seconds are the sum of its tests' in
``SECONDS`` (call and setup, from ``pytest --durations`` on 2 busy cores), or
``DEFAULT_SECONDS`` for a test not listed, plus the group's own entry (the setup its tests
share). A stale entry only moves a test in the queue.
"""

from __future__ import annotations

import pytest

DEFAULT_SECONDS = 0.3

SECONDS = {
    # the Ray group (one local cluster at a time)
    "tests/recipes/test_distributed_sac_smoke.py::test_distributed_sac_smoke": 54,
    "tests/distributed/test_ray_replay.py::"
    "test_collectors_feed_the_served_buffer_and_their_shards": 32,
    # groups whose setup is a long run shared by their tests (named by group)
    "doc-blocks": 47,  # tests/test_readme.py's shared interpreter
    "recipe-sac": 47,  # tests/recipes/test_recipes_smoke.py's runs (and a rollout)
    "recipe-bc_camera": 26,
    "recipe-sac_uniform": 20,
    "recipe-bc": 15,
    "recipe-offline_rl": 15,
    "test_robomimic_training": 13,
    "test_ddp_windowed": 24,  # a DDP run in a module fixture
    "test_ddp": 23,
    # single tests
    "tests/recipes/test_recipe_runs.py::test_every_recipe_runs_with_its_shipped_config"
    "[bc_camera]": 29,
    "tests/recipes/test_recipe_runs.py::test_every_recipe_runs_with_its_shipped_config[sac]": 15,
    "tests/recipes/test_recipe_runs.py::test_every_recipe_runs_with_its_shipped_config[bc]": 12,
    "tests/recipes/test_recipe_runs.py::test_every_recipe_runs_with_its_shipped_config"
    "[offline_rl]": 10,
    "tests/data/test_torture_smoke.py::test_a_short_torture_run_is_all_on_target": 20,
    "tests/samplers/test_sumtree.py::test_compiled_inductor_matches_eager": 41,
    "tests/cli/test_concurrent_import.py::"
    "test_a_second_overwriting_import_leaves_the_first_and_the_old_store": 30,
    "tests/cli/test_concurrent_import.py::"
    "test_a_second_import_to_one_dest_is_refused_and_the_first_finishes": 21,
    "tests/data/test_crash_safety.py::test_sigkilled_writer_keeps_every_committed_episode": 29,
    "tests/data/test_live_encoded_readers.py::"
    "test_reads_following_a_live_writer_of_an_encoded_column_raise_no_false_alarm[jpeg]": 23,
    "tests/data/test_live_readers.py::"
    "test_readers_following_thousands_of_tiny_commits_raise_no_false_alarm": 21,
    "tests/lerobot/test_lerobot_crash.py::test_sigkill_loses_at_most_the_episode_in_progress": 21,
    "tests/data/test_cameras_benchmark_smoke.py::"
    "test_a_quick_run_prints_every_row_and_its_target": 21,
    "tests/lightning/test_process_boundary.py::"
    "test_dataloader_workers_leave_the_parents_batches_alone[spawn]": 18,
    "tests/cli/test_interrupt.py::"
    "test_ctrl_c_during_demo_reports_committed_episodes_and_resumes_to_the_same_rows": 15,
    "tests/cli/test_interrupt.py::"
    "test_ctrl_c_during_import_lafan_then_the_printed_resume_command_finishes_it": 15,
    "tests/cli/test_interrupt.py::test_sigterm_during_an_import_cleans_up_like_ctrl_c": 13,
    "tests/cli/test_interrupt_moments.py::test_ctrl_c_during_an_import_at_several_moments"
    "[writing]": 15,
}


def _unit(nodeid: str) -> tuple[str, str]:
    """(the work unit xdist schedules a test in, the test's own id): a ``@group`` suffix
    names the unit (as in xdist's ``LoadGroupScheduling``), else the test is a unit."""
    if nodeid.rfind("@") > nodeid.rfind("]"):
        test, group = nodeid.rsplit("@", 1)
        return group, test
    return nodeid, nodeid


def longest_first(items: list) -> list:
    """``items`` with their work units in order of expected seconds, longest first; the
    tests of one unit keep their order, and equal units their collection order."""
    units: dict[str, list] = {}
    seconds: dict[str, float] = {}
    for item in items:
        unit, test = _unit(item.nodeid)
        if unit not in units:
            units[unit] = []
            seconds[unit] = SECONDS.get(unit, 0.0) if unit != test else 0.0
        units[unit].append(item)
        seconds[unit] += SECONDS.get(test, DEFAULT_SECONDS)
    order = sorted(units, key=lambda unit: -seconds[unit])  # stable: ties keep their order
    return [item for unit in order for item in units[unit]]


@pytest.hookimpl(trylast=True)  # after the groups are in the test ids
def pytest_collection_modifyitems(config, items):
    if hasattr(config, "workerinput") and config.getvalue("loadgroup"):
        # a test worker under --dist loadgroup: its collection is the order of work
        items[:] = longest_first(items)
