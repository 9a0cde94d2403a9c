"""The vendor mapping tables, code by code, against the vendors' published tables.

Expected values are written by hand from:
- NVIDIA, "Analyzing Xid Errors with the Xid Catalog" (docs.nvidia.com/deploy/xid-errors/
  analyzing-xid-catalog.html), sheet "Xids", column "Resolution Bucket (Immediate
  Action)", and the "XID 144-150 Decode" sheet for NVLink5;
- NVIDIA cuda-python NVML bindings, DeviceGpuRecoveryAction (values 0-7);
- Huawei MindCluster 7.3, "Fault levels and handling suggestions" (dlug_api_035) and the
  Ascend Device Plugin faultCode.json classes in collectors/ascend_fault_codes.yaml.
"""

from __future__ import annotations

import pytest

from hetpatrol import kernel_log
from hetpatrol.actions import vocabulary
from hetpatrol.actions.vocabulary import (
    ISOLATE_CARD,
    NONE,
    REBOOT_NODE,
    REPLACE_CARD,
    RESET_CARD,
    RESTART_JOB,
    WATCH,
)
from hetpatrol.checks import kernel_events as xid
from hetpatrol.collectors import ascend_levels, nvidia_xid, nvml_recovery
from tests.conftest import samples_dir

# ------------------------------------------------------------------ vocabulary


def test_vocabulary_order_and_highest():
    assert vocabulary.ACTIONS == (
        "none",
        "watch",
        "restart_job",
        "reset_card",
        "reboot_node",
        "isolate_card",
        "replace_card",
    )
    assert vocabulary.highest([WATCH, REPLACE_CARD, RESET_CARD]) == REPLACE_CARD
    assert vocabulary.highest([]) == NONE
    assert vocabulary.highest([REBOOT_NODE, ISOLATE_CARD]) == ISOLATE_CARD
    with pytest.raises(ValueError, match="not an action word: 'critical'"):
        vocabulary.highest(["critical"])
    assert vocabulary.parse_action(" Reset-Card ") == RESET_CARD
    with pytest.raises(ValueError, match="one of none, watch"):
        vocabulary.parse_action("drain")
    assert {RESET_CARD, REBOOT_NODE, ISOLATE_CARD, REPLACE_CARD} == vocabulary.DEFAULT_DRAIN_ACTIONS
    assert set(vocabulary.MEANING) == set(vocabulary.ACTIONS)


# --------------------------------------------------------------- NVIDIA XIDs
# By hand from the catalog's "Xids" sheet (immediate action bucket -> our word).
RESTART_APP_XIDS = (
    [8, 11, 13, 25, 31, 32, 39, 40, 41, 60, 68, 69, 70, 71, 72, 75, 76, 77, 80]
    + [82, 83, 84, 85, 86, 88, 89, 94]
    + list(range(96, 106))
    + list(range(126, 136))
    + [139]
)
IGNORE_XIDS = [14, 37, 38, 43, 44, 63, 66, 67, 92, 93, 106, 107, 108, 121, 137, 141, 152]
IGNORE_XIDS += [153, 157, 160, 161]
RESET_GPU_XIDS = [46, 62, 64, 95, 109, 110, 119, 120, 136, 140, 143, 155, 156, 158]
UNUSED_XIDS = [1, 2, 3, 4, 5, 6, 7, 9, 10, 12, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24]
UNUSED_XIDS += [26, 27, 28, 29, 30, 33, 34, 35, 36, 42, 47, 49, 50, 51, 52, 53, 55, 56]
UNUSED_XIDS += [57, 58, 59, 61, 65, 73, 81, 87, 90, 91, 111, 112, 113, 114, 115, 116, 117]
UNUSED_XIDS += [118, 122, 123, 124, 125, 138]
NO_BUCKET_XIDS = list(range(162, 173))
EXPECTED_XID = {
    **{x: RESTART_JOB for x in RESTART_APP_XIDS},
    **{x: NONE for x in IGNORE_XIDS},
    **{x: RESET_CARD for x in RESET_GPU_XIDS},
    **{x: WATCH for x in UNUSED_XIDS + NO_BUCKET_XIDS},
    45: WATCH,  # WORKFLOW_XID_45: sympathetic, follow the other Xid
    48: RESET_CARD,  # WORKFLOW_XID_48: solo RESET_GPU, with 63/64 DRAIN_AND_RESET
    54: ISOLATE_CARD,  # CHECK_MECHANICALS (auxiliary power not connected)
    74: RESET_CARD,  # WORKFLOW_NVLINK_ERR: "A GPU reset or node reboot is needed"
    78: WATCH,  # UPDATE_SWFW (vGPU start error)
    79: REBOOT_NODE,  # RESTART_BM: GPU has fallen off the bus
    142: ISOLATE_CARD,  # CONTACT_SUPPORT (NVENC3 error, GB200)
    151: REBOOT_NODE,  # RESTART_VM (key rotation error)
    159: RESET_CARD,  # CHECK_UVM: "If UVM/vGPU is being utilized, RESET_GPU"
}


def test_every_catalog_xid_has_its_hand_written_action():
    assert set(nvidia_xid.CATALOG) == set(range(1, 173))
    assert set(EXPECTED_XID) | set(range(144, 151)) | {154} == set(range(1, 173))
    wrong = {
        x: (nvidia_xid.xid_action(x).action, want)
        for x, want in EXPECTED_XID.items()
        if nvidia_xid.xid_action(x).action != want
    }
    assert wrong == {}


@pytest.mark.parametrize(
    ("xid_no", "mnemonic", "bucket"),
    [
        (79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM"),
        (94, "ROBUST_CHANNEL_CONTAINED_ERROR", "RESTART_APP"),
        (95, "ROBUST_CHANNEL_UNCONTAINED_ERROR", "RESET_GPU"),
        (119, "GSP_RPC_TIMEOUT", "RESET_GPU"),
        (120, "GSP_ERROR", "RESET_GPU"),
        (154, "GPU_RECOVERY_ACTION_CHANGED", "XID_154"),
    ],
)
def test_catalog_rows_read(xid_no, mnemonic, bucket):
    row = nvidia_xid.CATALOG[xid_no]
    assert (row.mnemonic, row.bucket) == (mnemonic, bucket)


def test_reason_names_the_bucket_and_unknown_keeps_the_raw_code():
    v = nvidia_xid.xid_action(79)
    assert v.to_dict() == {
        "action": REBOOT_NODE,
        "source": "nvidia_xid",
        "code": "xid:79",
        "reason": "XID 79 ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS: RESTART_BM",
    }
    assert nvidia_xid.xid_action(173) == vocabulary.ActionVerdict(
        WATCH, "unknown", "xid:173", "XID 173 is not in NVIDIA's catalog"
    )
    assert nvidia_xid.xid_action("9x").action == WATCH
    assert nvidia_xid.xid_action("9x").code == "xid:9x"
    assert nvidia_xid.xid_action(56).reason.endswith("catalog says Unused")


def test_nvlink5_follows_the_decode_sheet_fatality():
    # XID 144-150 Decode: every Fatal / Link Fatal row is RESET_GPU, Non-fatal rows are
    # IGNORE or XID_154_EVAL
    for x in range(144, 151):
        assert nvidia_xid.xid_action(x, fatal=True).action == RESET_CARD
        assert nvidia_xid.xid_action(x, fatal=False).action == WATCH
        assert nvidia_xid.xid_action(x).action == RESET_CARD  # no word: as xid.classify


@pytest.mark.parametrize(
    ("text", "action"),
    [
        # catalog row 154: "from 0x0 (None) to 0x2 (Node Reboot Required)"
        ("0x2 (Node Reboot Required)", REBOOT_NODE),
        ("0x0 (None)", NONE),
        ("GPU Reset Required", RESET_CARD),
        ("Node Reboot Required", REBOOT_NODE),
        ("Drain P2P", RESTART_JOB),
        ("Drain and Reset", RESET_CARD),
        ("0x4", RESET_CARD),
        ("Reboot the datacenter", WATCH),
        (None, WATCH),
    ],
)
def test_xid_154_takes_the_recovery_action_it_names(text, action):
    assert nvidia_xid.xid_action(154, recovery_action=text).action == action


def test_overrides_win():
    v = nvidia_xid.xid_action(13, overrides={"xid:13": WATCH})
    assert (v.action, v.source) == (WATCH, "override")


def test_consistent_with_the_existing_xid_classes():
    for x in xid.DRAIN_XIDS:  # hetpatrol's drain class: at least a reset
        assert vocabulary.rank(nvidia_xid.xid_action(x).action) >= vocabulary.rank(RESET_CARD), x
    for x in xid.APPLICATION_XIDS:  # the job's fault: never more than restarting it
        assert vocabulary.rank(nvidia_xid.xid_action(x).action) <= vocabulary.rank(RESTART_JOB)
    for x in xid.INFO_XIDS:
        assert nvidia_xid.xid_action(x).action == NONE


def test_recorded_syslog_events_get_their_actions():
    # syslog_xid-48-dbe_xid-64_rminitadapter-failed.txt: XID 48 (DBE) and 64 on
    # 0000:07:00, RmInitAdapter failed on 0000:0a:00.0
    text = (samples_dir("nvidia") / "syslog_xid-48-dbe_xid-64_rminitadapter-failed.txt").read_text()
    got = set()
    for ev in kernel_log.parse_text(text):
        if ev.kind == kernel_log.KIND_XID:
            got.add((ev.xid, nvidia_xid.xid_action(ev.xid).action))
        else:
            got.add((ev.reason, nvidia_xid.kernel_reason_action(ev.reason).action))
    assert got == {
        (48, RESET_CARD),
        (64, RESET_CARD),
        ("rm_init_adapter_failed", RESET_CARD),
    }


def test_kernel_reasons():
    assert nvidia_xid.kernel_reason_action("fallen_off_bus").action == REBOOT_NODE
    assert nvidia_xid.kernel_reason_action("reset_required").action == RESET_CARD
    v = nvidia_xid.kernel_reason_action("gremlins")
    assert (v.action, v.code) == (WATCH, "kernel:gremlins")


# -------------------------------------------------------------- NVML recovery
@pytest.mark.parametrize(
    ("value", "action"),
    [
        (0, NONE),  # GPU_RECOVERY_ACTION_NONE: No action needed.
        (1, RESET_CARD),  # GPU_RESET: Reset Gpu.
        (2, REBOOT_NODE),  # NODE_REBOOT: Reboot Node.
        (3, RESTART_JOB),  # DRAIN_P2P: terminate the P2P processes, then ask again
        (4, RESET_CARD),  # DRAIN_AND_RESET: Drain P2P and Reset Gpu.
        (5, RESTART_JOB),  # RECOVER_IMEX_DOMAIN: the IMEX service's, not a card's
        (6, RESET_CARD),  # BUS_RESET: Reset the GPU's PCIe bus.
        (7, REBOOT_NODE),  # SYSTEM_REBOOT: Reboot the system.
        ("NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET", RESET_CARD),
        ("GPU_RECOVERY_ACTION_NODE_REBOOT", REBOOT_NODE),
        ("node_reboot", REBOOT_NODE),
        ("0x1", RESET_CARD),
        ("2", REBOOT_NODE),
        (8, WATCH),
        (-1, WATCH),
        (True, WATCH),
        ("sometimes", WATCH),
        (None, WATCH),
    ],
)
def test_nvml_recovery_action(value, action):
    assert nvml_recovery.recovery_action(value).action == action


def test_nvml_unknown_keeps_the_raw_value():
    assert nvml_recovery.recovery_action(8).code == "nvml_recovery:8"
    assert nvml_recovery.recovery_action(2).reason == "NODE_REBOOT"


# ------------------------------------------------------- Ascend MindCluster
@pytest.mark.parametrize(
    ("level", "action"),
    [
        ("NotHandleFault", NONE),  # "no action is required"
        ("SubHealthFault", WATCH),  # handled by the job's subHealthyStrategy
        ("RestartRequest", RESTART_JOB),  # "the service request needs to be executed again"
        ("RestartBusiness", RESTART_JOB),  # "the service needs to be executed again"
        ("FreeRestartNPU", RESET_CARD),  # "reset when it is idle"
        ("RestartNPU", RESET_CARD),  # reset immediately
        ("SeparateNPU", ISOLATE_CARD),  # "the processor needs to be isolated"
        ("PreSeparateNPU", ISOLATE_CARD),  # "no further jobs scheduled to this processor"
        ("ManuallySeparateNPU", ISOLATE_CARD),
        ("SeparateNPUCodes", ISOLATE_CARD),  # faultCode.json class name
        ("Whatever", WATCH),
        (None, WATCH),
    ],
)
def test_ascend_levels(level, action):
    assert ascend_levels.level_action(level).action == action


@pytest.mark.parametrize(
    ("code", "action"),
    [
        # collectors/ascend_fault_codes.yaml (from faultCode.json): class -> level -> action
        ("A4025021", NONE),  # NotHandleFaultCodes
        ("81A3880C", WATCH),  # SubHealthFaultCodes
        ("80C98008", RESTART_JOB),  # RestartRequestCodes
        ("8C204E00", RESTART_JOB),  # RestartBusinessCodes
        ("8C084E00", RESET_CARD),  # FreeRestartNPUCodes
        ("8C03A000", RESET_CARD),  # RestartNPUCodes
        ("80E3A201", ISOLATE_CARD),  # SeparateNPUCodes
        ("a8028801", ISOLATE_CARD),  # SeparateNPUCodes, lower case read
        ("DEADBEEF", WATCH),  # not in the table
    ],
)
def test_ascend_codes_from_the_bundled_table(code, action):
    levels = ascend_levels.load_code_levels()
    v = ascend_levels.code_action(code, levels)
    assert v.action == action
    assert v.code == f"ascend:{code.upper()}"


def test_level_column_added_without_breaking_the_existing_table():
    from hetpatrol.collectors.ascend_levels import fault_code_table

    # the severity/class/action prose the ascend_fault_code finding uses are unchanged
    assert fault_code_table().lookup("80E3A201") == (
        "critical",
        "SeparateNPUCodes",
        "isolate the NPU and have it replaced",
    )
    levels = ascend_levels.load_code_levels()
    assert levels["80E3A201"] == "SeparateNPU"
    assert levels["A4025021"] == "NotHandleFault"


def test_a_class_without_level_falls_back_to_its_name_and_bad_tables_are_refused():
    doc = {
        "classes": {"RestartNPUCodes": {"severity": "critical"}},
        "codes": {"RestartNPUCodes": ["8c1fa006"]},
    }
    assert ascend_levels.code_levels_from_document(doc) == {"8C1FA006": "RestartNPU"}
    with pytest.raises(ValueError, match="needs 'classes' and 'codes'"):
        ascend_levels.code_levels_from_document({"codes": []})


def test_ascend_override():
    v = ascend_levels.code_action(
        "80e3a201", {"80E3A201": "SeparateNPU"}, {"ascend:80E3A201": WATCH}
    )
    assert (v.action, v.source) == (WATCH, "override")


def test_xid_154_lines_through_the_kernel_log_parser():
    # the catalog's own example (row 154): "GPU recovery action changed from 0x0 (None) to
    # 0x2 (Node Reboot Required)", and the way back to None
    text = (
        "NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to "
        "0x2 (Node Reboot Required)\n"
        "NVRM: Xid (PCI:0000:5d:00): 154, GPU recovery action changed from 0x1 (GPU Reset "
        "Required) to 0x0 (None)\n"
    )
    got = [
        nvidia_xid.xid_action(ev.xid, recovery_action=ev.recovery_action).action
        for ev in kernel_log.parse_text(text)
    ]
    assert got == [REBOOT_NODE, NONE]
