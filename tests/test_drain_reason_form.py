"""One drain reason form everywhere: ``hetpatrol: <action> <card> <code> <why>`` from the
daemon's drain, the Prolog and the Epilog, the why being the finding's message
(docs/actions.md "Drain by action", docs/slurm.md "Drain and resume").

fixtures/nodes/sick-mixed: GPU 1 has remapped rows pending (nvidia-smi -q
"Pending : Yes"), the check's message "remapped rows pending: the GPU needs a reset"
(``hetpatrol once --replay fixtures/nodes/sick-mixed``); GPU 3 is lost (GpuIsLost).
"""

from __future__ import annotations

import time
from dataclasses import replace

from conftest import NODES

from hetpatrol.config import load_config
from hetpatrol.exporters.state import write_state
from hetpatrol.patrol import Patroller
from hetpatrol.slurm.drain import drain_reason
from hetpatrol.slurm.epilog import run_epilog
from hetpatrol.slurm.jobguard import Allocation, decide, read_state_bounded

GPU1 = (
    "hetpatrol: reset_card nvidia/1 remapped_rows_pending remapped rows pending: the GPU "
    "needs a reset"
)


def _report():
    p = Patroller(replace(load_config(), node="n1"), replay_dir=NODES / "sick-mixed")
    try:
        return p.run()
    finally:
        p.close()


def test_daemon_prolog_and_epilog_give_one_reason_with_the_findings_message(tmp_path):
    report = _report()
    assert drain_reason(report, frozenset({"reset_card"})) == GPU1
    assert drain_reason(report) == (
        "hetpatrol: reboot_node nvidia/3 vendor_health vendor health 'gpu_is_lost' (+1 more)"
    )
    state = tmp_path / "state.json"
    write_state(state, report, 10.0)
    doc = read_state_bounded(state)
    prolog = decide(doc, Allocation({"gpu": frozenset({1})}), now=time.time())
    assert (prolog.exit_code, prolog.reason) == (1, GPU1)
    calls = []
    env = {
        "SLURM_JOB_ID": "42",
        "SLURMD_NODENAME": "n1",
        "SLURM_JOB_GPUS": "1",
        "ASCEND_VISIBLE_DEVICES": "",
    }
    code, line = run_epilog(
        env, state, _report, runner=lambda argv, t: calls.append(argv) or "", scontrol="sc"
    )
    assert (code, line) == (0, GPU1)
    assert calls == [["sc", "update", "NodeName=n1", "State=DRAIN", f"Reason={GPU1}"]]


def test_a_node_findings_reason_has_the_same_form(tmp_path):
    """A node finding that needs a reboot: ``<action> node <check> <message>`` from the
    daemon and the Prolog alike; a control character of the message is a space."""
    from hetpatrol.schema import Finding

    report = _report()
    lost = Finding("nvml_driver", "critical", "NVML driver\x1b[31m gone", action="reboot_node")
    report = replace(report, node_findings=(*report.node_findings, lost))
    for rec in report.cards:
        rec.action = "none"
    assert drain_reason(report) == "hetpatrol: reboot_node node nvml_driver NVML driver [31m gone"
