"""XID -> action, from NVIDIA's published XID catalog.

Source: NVIDIA, "Analyzing Xid Errors with the Xid Catalog" (Ampere and newer GPUs),
https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html and its
spreadsheet ``Xid-Catalog.xlsx`` (sheet "Xids", columns Code, Mnemonic, Description,
Applies to A100/H100/B100/GB200, "Resolution Bucket (Immediate Action)"). The catalog
says the immediate action "is intended as an automatable action that administrators can
perform to recover the system"; that column is what is mapped here. Every row of the
"Xids" sheet, XID 1 to 172, was read and is copied below (code, mnemonic, applies-to
flags, immediate-action bucket), so that a test can check each code against it.

Buckets -> actions (the bucket texts are the catalog's "Guidance Classes" sheet):

===========================  ==============  ==============================================
bucket                       action          why
===========================  ==============  ==============================================
IGNORE                       none            "No Action required"
RESTART_APP                  restart_job     "The application should be restarted"
XID_154_EVAL                 restart_job     "If no XID 154 present, RESTART_APP" (an XID
                                             154 present gives its own, higher action)
WORKFLOW_XID_45              watch           "Solo: RESTART_FM; Not Solo: IGNORE (follow
                                             other Xid)": sympathetic; the primary XID
                                             carries the action, a Fabric Manager restart
                                             is not a card action
RESET_GPU                    reset_card      reset the GPU (``nvidia-smi -r``)
WORKFLOW_XID_48              reset_card      "Solo: RESET_GPU, w/ 63 or 64:
                                             DRAIN_AND_RESET" (both a reset); a repeat is
                                             escalated (see escalation.py)
WORKFLOW_NVLINK_ERR          reset_card      XID 74 trigger text: "A GPU reset or node
                                             reboot is needed to clear this error"
WORKFLOW_NVLINK5_ERR         reset_card if   the "XID 144-150 Decode" sheet, by IntrInfo and
                             the decode is   Error Status (the kernel log's judge decodes
                             RESET_GPU,      the line: its XID finding is critical for
                             else watch      RESET_GPU); IGNORE / XID_154_EVAL rows watch
CHECK_UVM                    reset_card      "If UVM/vGPU is being utilized, RESET_GPU":
                                             nvidia-uvm is loaded on every CUDA node
RESTART_BM                   reboot_node     "Restart bare metal, system should be
                                             restarted"
RESTART_VM                   reboot_node     "VM owning the affected GPU must be
                                             restarted": the node's OS is that VM
CONTACT_SUPPORT              isolate_card    "contact your support organization for
                                             further investigation"
CHECK_MECHANICALS            isolate_card    "Check ... device seating and all applicable
                                             connections": a person at the card
UPDATE_SWFW                  watch           "Update Firmware and Software": not a card
                                             fault (XID 78, vGPU start)
XID_154                      (from the text) the recovery action the XID 154 line names,
                                             see :mod:`hetpatrol.collectors.nvml_recovery`
(empty / prose only)         watch           XIDs 162-172 have no bucket yet
===========================  ==============  ==============================================

Rows whose description is "Unused" and that apply to none of A100/H100/B100/GB200 (the
catalog: "Unused could mean Code is deprecated or V100 or earlier") map to ``watch``,
not to their ``CONTACT_SUPPORT`` bucket: on such a GPU the code means something the
catalog does not describe, and one unexplained signal never drains. An XID not in the
catalog (above 172) is ``watch`` with the raw number, never ``none``.

Pure data and functions: standard library only.
"""

from __future__ import annotations

from typing import NamedTuple

from hetpatrol.actions.vocabulary import (
    ISOLATE_CARD,
    NONE,
    REBOOT_NODE,
    RESET_CARD,
    RESTART_JOB,
    WATCH,
    ActionVerdict,
)
from hetpatrol.collectors.nvml_recovery import recovery_action_from_text

CATALOG_URL = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"

#: immediate-action bucket -> action word (see the module docstring for each reason)
BUCKET_ACTION: dict[str, str] = {
    "IGNORE": NONE,
    "RESTART_APP": RESTART_JOB,
    "XID_154_EVAL": RESTART_JOB,
    "WORKFLOW_XID_45": WATCH,
    "RESET_GPU": RESET_CARD,
    "WORKFLOW_XID_48": RESET_CARD,
    "WORKFLOW_NVLINK_ERR": RESET_CARD,
    "CHECK_UVM": RESET_CARD,
    "RESTART_BM": REBOOT_NODE,
    "RESTART_VM": REBOOT_NODE,
    "CONTACT_SUPPORT": ISOLATE_CARD,
    "CHECK_MECHANICALS": ISOLATE_CARD,
    "UPDATE_SWFW": WATCH,
}

# The "Xids" sheet, one row per line: code | mnemonic | applies to A100 H100 B100 GB200
# (Y/N) | immediate-action bucket ("-" = none given) | U when the description is
# "Unused". Copied by hand from the catalog page (read 2026-12-01).
_CATALOG = """
1|ROBUST_CHANNEL_FIFO_ERROR_FIFO_METHOD|NNNN|CONTACT_SUPPORT|U
2|ROBUST_CHANNEL_FIFO_ERROR_SW_METHOD|NNNN|CONTACT_SUPPORT|U
3|ROBUST_CHANNEL_FIFO_ERROR_UNK_METHOD|NNNN|CONTACT_SUPPORT|U
4|ROBUST_CHANNEL_FIFO_ERROR_CHANNEL_BUSY|NNNN|CONTACT_SUPPORT|U
5|ROBUST_CHANNEL_FIFO_ERROR_RUNOUT_OVERFLOW|NNNN|CONTACT_SUPPORT|U
6|ROBUST_CHANNEL_FIFO_ERROR_PARSE_ERR|NNNN|CONTACT_SUPPORT|U
7|ROBUST_CHANNEL_FIFO_ERROR_PTE_ERR|NNNN|CONTACT_SUPPORT|U
8|ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT|YYYY|RESTART_APP|
9|ROBUST_CHANNEL_GR_ERROR_INSTANCE|NNNN|CONTACT_SUPPORT|U
10|ROBUST_CHANNEL_GR_ERROR_SINGLE_STEP|NNNN|CONTACT_SUPPORT|U
11|ROBUST_CHANNEL_GR_ERROR_MISSING_HW|YYYY|RESTART_APP|
12|ROBUST_CHANNEL_GR_ERROR_SW_METHOD|NNNN|CONTACT_SUPPORT|U
13|ROBUST_CHANNEL_GR_EXCEPTION|YYYY|RESTART_APP|
14|ROBUST_CHANNEL_FAKE_ERROR|YYYY|IGNORE|U
15|ROBUST_CHANNEL_SCANLINE_TIMEOUT|NNNN|CONTACT_SUPPORT|U
16|ROBUST_CHANNEL_VBLANK_CALLBACK_TIMEOUT|NNNN|CONTACT_SUPPORT|U
17|ROBUST_CHANNEL_PARAMETER_ERROR|NNNN|CONTACT_SUPPORT|U
18|ROBUST_CHANNEL_BUS_MASTER_TIMEOUT_ERROR|NNNN|CONTACT_SUPPORT|U
19|ROBUST_CHANNEL_DISP_MISSED_NOTIFIER|NNNN|CONTACT_SUPPORT|U
20|ROBUST_CHANNEL_MPEG_ERROR_SW_METHOD|NNNN|CONTACT_SUPPORT|U
21|ROBUST_CHANNEL_ME_ERROR_SW_METHOD|NNNN|CONTACT_SUPPORT|U
22|ROBUST_CHANNEL_VP_ERROR_SW_METHOD|NNNN|CONTACT_SUPPORT|U
23|ROBUST_CHANNEL_RC_LOGGING_ENABLED|NNNN|CONTACT_SUPPORT|U
24|ROBUST_CHANNEL_GR_SEMAPHORE_TIMEOUT|NNNN|CONTACT_SUPPORT|U
25|ROBUST_CHANNEL_GR_ILLEGAL_NOTIFY|YYYY|RESTART_APP|
26|ROBUST_CHANNEL_FIFO_ERROR_FBISTATE_TIMEOUT|NNNN|CONTACT_SUPPORT|U
27|ROBUST_CHANNEL_VP_ERROR|NNNN|CONTACT_SUPPORT|U
28|ROBUST_CHANNEL_VP2_ERROR|NNNN|CONTACT_SUPPORT|U
29|ROBUST_CHANNEL_BSP_ERROR|NNNN|CONTACT_SUPPORT|U
30|ROBUST_CHANNEL_BAD_ADDR_ACCESS|NNNN|CONTACT_SUPPORT|U
31|ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT|YYYY|RESTART_APP|
32|ROBUST_CHANNEL_PBDMA_ERROR|YYYY|RESTART_APP|
33|ROBUST_CHANNEL_SEC_ERROR|NNNN|CONTACT_SUPPORT|U
34|ROBUST_CHANNEL_MSVLD_ERROR|NNNN|CONTACT_SUPPORT|U
35|ROBUST_CHANNEL_MSPDEC_ERROR|NNNN|CONTACT_SUPPORT|U
36|ROBUST_CHANNEL_MSPPP_ERROR|NNNN|CONTACT_SUPPORT|U
37|ROBUST_CHANNEL_FECS_ERR_UNIMP_FIRMWARE_METHOD|YYYY|IGNORE|
38|ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT|YYYY|IGNORE|
39|ROBUST_CHANNEL_CE0_ERROR|YYYY|RESTART_APP|
40|ROBUST_CHANNEL_CE1_ERROR|YYYY|RESTART_APP|
41|ROBUST_CHANNEL_CE2_ERROR|YYYY|RESTART_APP|
42|ROBUST_CHANNEL_VIC_ERROR|NNNN|CONTACT_SUPPORT|U
43|ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR|YYYY|IGNORE|
44|ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW|YYYY|IGNORE|
45|ROBUST_CHANNEL_PREEMPTIVE_REMOVAL|YYYY|WORKFLOW_XID_45|
46|ROBUST_CHANNEL_GPU_TIMEOUT_ERROR|YYYY|RESET_GPU|
47|ROBUST_CHANNEL_NVENC0_ERROR|NNNN|CONTACT_SUPPORT|U
48|ROBUST_CHANNEL_GPU_ECC_DBE|YYYY|WORKFLOW_XID_48|
49|SILENT_RUNNING_CONSTANT_LEVEL_SET_BY_REGISTRY|NNNN|CONTACT_SUPPORT|U
50|SILENT_RUNNING_LEVEL_TRANSITION_DUE_TO_RC_ERROR|NNNN|CONTACT_SUPPORT|U
51|SILENT_RUNNING_STRESS_TEST_FAILURE|NNNN|CONTACT_SUPPORT|U
52|SILENT_RUNNING_LEVEL_TRANS_DUE_TO_TEMP_RISE|NNNN|CONTACT_SUPPORT|U
53|SILENT_RUNNING_TEMP_REDUCED_CLOCKING|NNNN|CONTACT_SUPPORT|U
54|SILENT_RUNNING_PWR_REDUCED_CLOCKING|YYYN|CHECK_MECHANICALS|
55|SILENT_RUNNING_TEMPERATURE_READ_ERROR|NNNN|CONTACT_SUPPORT|U
56|DISPLAY_CHANNEL_EXCEPTION|NNNN|CONTACT_SUPPORT|U
57|FB_LINK_TRAINING_FAILURE_ERROR|NNNN|CONTACT_SUPPORT|U
58|FB_MEMORY_ERROR|NNNN|CONTACT_SUPPORT|U
59|PMU_ERROR|NNNN|CONTACT_SUPPORT|U
60|ROBUST_CHANNEL_SEC2_ERROR|YYYY|RESTART_APP|
61|PMU_BREAKPOINT|NNNN|CONTACT_SUPPORT|U
62|PMU_HALT_ERROR|YYYY|RESET_GPU|
63|INFOROM_DRAM_RETIREMENT_EVENT|YYYY|IGNORE|
64|INFOROM_DRAM_RETIREMENT_FAILURE|YYYY|RESET_GPU|
65|ROBUST_CHANNEL_NVENC1_ERROR|NNNN|CONTACT_SUPPORT|U
66|ROBUST_CHANNEL_FECS_ERR_REG_ACCESS_VIOLATION|YYYY|IGNORE|
67|ROBUST_CHANNEL_FECS_ERR_VERIF_VIOLATION|YYYY|IGNORE|
68|ROBUST_CHANNEL_NVDEC0_ERROR|YYYY|RESTART_APP|
69|ROBUST_CHANNEL_GR_CLASS_ERROR|YYYY|RESTART_APP|
70|ROBUST_CHANNEL_CE3_ERROR|YYYY|RESTART_APP|
71|ROBUST_CHANNEL_CE4_ERROR|YYYY|RESTART_APP|
72|ROBUST_CHANNEL_CE5_ERROR|YYYY|RESTART_APP|
73|ROBUST_CHANNEL_NVENC2_ERROR|NNNN|CONTACT_SUPPORT|U
74|NVLINK_ERROR|YYNN|WORKFLOW_NVLINK_ERR|
75|ROBUST_CHANNEL_CE6_ERROR|YYYY|RESTART_APP|
76|ROBUST_CHANNEL_CE7_ERROR|YYYY|RESTART_APP|
77|ROBUST_CHANNEL_CE8_ERROR|YYYY|RESTART_APP|
78|VGPU_START_ERROR|YYYY|UPDATE_SWFW|
79|ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS|YYYY|RESTART_BM|
80|PBDMA_PUSHBUFFER_CRC_MISMATCH|YYNN|RESTART_APP|
81|ROBUST_CHANNEL_VGA_SUBSYSTEM_ERROR|NNNN|CONTACT_SUPPORT|U
82|ROBUST_CHANNEL_NVJPG0_ERROR|YYYY|RESTART_APP|
83|ROBUST_CHANNEL_NVDEC1_ERROR|YYYY|RESTART_APP|
84|ROBUST_CHANNEL_NVDEC2_ERROR|YYYY|RESTART_APP|
85|ROBUST_CHANNEL_CE9_ERROR|YYYY|RESTART_APP|
86|ROBUST_CHANNEL_OFA0_ERROR|YYYY|RESTART_APP|
87|NVTELEMETRY_DRIVER_REPORT|NNNN|CONTACT_SUPPORT|U
88|ROBUST_CHANNEL_NVDEC3_ERROR|YYYY|RESTART_APP|
89|ROBUST_CHANNEL_NVDEC4_ERROR|YYYY|RESTART_APP|
90|LTC_ERROR|NNNN|CONTACT_SUPPORT|U
91|RESERVED_XID|NNNN|CONTACT_SUPPORT|U
92|EXCESSIVE_SBE_INTERRUPTS|YYYY|IGNORE|
93|INFOROM_ERASE_LIMIT_EXCEEDED|YNNN|IGNORE|
94|ROBUST_CHANNEL_CONTAINED_ERROR|YYYY|RESTART_APP|
95|ROBUST_CHANNEL_UNCONTAINED_ERROR|YYYY|RESET_GPU|
96|ROBUST_CHANNEL_NVDEC5_ERROR|NYYY|RESTART_APP|
97|ROBUST_CHANNEL_NVDEC6_ERROR|NYYY|RESTART_APP|
98|ROBUST_CHANNEL_NVDEC7_ERROR|NYYY|RESTART_APP|
99|ROBUST_CHANNEL_NVJPG1_ERROR|NYYY|RESTART_APP|
100|ROBUST_CHANNEL_NVJPG2_ERROR|NYYY|RESTART_APP|
101|ROBUST_CHANNEL_NVJPG3_ERROR|NYYY|RESTART_APP|
102|ROBUST_CHANNEL_NVJPG4_ERROR|NYYY|RESTART_APP|
103|ROBUST_CHANNEL_NVJPG5_ERROR|NYYY|RESTART_APP|
104|ROBUST_CHANNEL_NVJPG6_ERROR|NYYY|RESTART_APP|
105|ROBUST_CHANNEL_NVJPG7_ERROR|NYYY|RESTART_APP|
106|SMBPBI_TEST_MESSAGE|YYYY|IGNORE|
107|SMBPBI_TEST_MESSAGE_SILENT|YYYY|IGNORE|
108|NVLINK_REMOTE_TRANSLATION_ERROR|YYYY|IGNORE|U
109|ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR|YYYY|RESET_GPU|
110|SEC_FAULT_ERROR|NYYY|RESET_GPU|
111|BUNDLE_ERROR_EVENT|NNNN|CONTACT_SUPPORT|U
112|DISP_SUPERVISOR_ERROR|NNNN|CONTACT_SUPPORT|U
113|DP_LT_FAILURE|NNNN|CONTACT_SUPPORT|U
114|HEAD_RG_UNDERFLOW|NNNN|CONTACT_SUPPORT|U
115|CORE_CHANNEL_REGS|NNNN|CONTACT_SUPPORT|U
116|WINDOW_CHANNEL_REGS|NNNN|CONTACT_SUPPORT|U
117|CURSOR_CHANNEL_REGS|NNNN|CONTACT_SUPPORT|U
118|HEAD_REGS|NNNN|CONTACT_SUPPORT|U
119|GSP_RPC_TIMEOUT|YYYY|RESET_GPU|
120|GSP_ERROR|YYYY|RESET_GPU|
121|C2C_ERROR|NNNY|IGNORE|
122|SPI_PMU_RPC_READ_FAIL|NNNN|CONTACT_SUPPORT|U
123|SPI_PMU_RPC_WRITE_FAIL|NNNN|CONTACT_SUPPORT|U
124|SPI_PMU_RPC_ERASE_FAIL|NNNN|CONTACT_SUPPORT|U
125|INFOROM_FS_ERROR|NNNN|CONTACT_SUPPORT|U
126|ROBUST_CHANNEL_CE10_ERROR|NNYY|RESTART_APP|
127|ROBUST_CHANNEL_CE11_ERROR|NNYY|RESTART_APP|
128|ROBUST_CHANNEL_CE12_ERROR|NNYY|RESTART_APP|
129|ROBUST_CHANNEL_CE13_ERROR|NNYY|RESTART_APP|
130|ROBUST_CHANNEL_CE14_ERROR|NNYY|RESTART_APP|
131|ROBUST_CHANNEL_CE15_ERROR|NNYY|RESTART_APP|
132|ROBUST_CHANNEL_CE16_ERROR|NNYY|RESTART_APP|
133|ROBUST_CHANNEL_CE17_ERROR|NNYY|RESTART_APP|
134|ROBUST_CHANNEL_CE18_ERROR|NNYY|RESTART_APP|
135|ROBUST_CHANNEL_CE19_ERROR|NNYY|RESTART_APP|
136|ALI_TRAINING_FAIL|NYNN|RESET_GPU|
137|NVLINK_PRIV_ERR|YYYY|IGNORE|
138|ROBUST_CHANNEL_DLA_ERROR|NNNN|CONTACT_SUPPORT|U
139|ROBUST_CHANNEL_OFA1_ERROR|NNYY|RESTART_APP|
140|UNRECOVERABLE_ECC_ERROR_ESCAPE|YYYY|RESET_GPU|
141|ROBUST_CHANNEL_FAST_PATH_ERROR|NYYY|IGNORE|
142|ROBUST_CHANNEL_NVENC3_ERROR|NNNY|CONTACT_SUPPORT|
143|GPU_INIT_ERROR|NYYY|RESET_GPU|
144|NVLINK_SAW_ERROR|NNYY|WORKFLOW_NVLINK5_ERR|
145|NVLINK_RLW_ERROR|NNYY|WORKFLOW_NVLINK5_ERR|
146|NVLINK_TLW_ERROR|NNYY|WORKFLOW_NVLINK5_ERR|
147|NVLINK_TREX_ERROR|NNYY|WORKFLOW_NVLINK5_ERR|
148|NVLINK_NVLPW_CTRL_ERROR|NNYY|WORKFLOW_NVLINK5_ERR|
149|NVLINK_NETIR_ERROR|NNYY|WORKFLOW_NVLINK5_ERR|
150|NVLINK_MSE_ERROR|NNYY|WORKFLOW_NVLINK5_ERR|
151|ROBUST_CHANNEL_KEY_ROTATION_ERROR|NYYY|RESTART_VM|
152|ROBUST_CHANNEL_DLA_SMMU_ERROR|NNNN|IGNORE|
153|ROBUST_CHANNEL_DLA_TIMEOUT|NNNN|IGNORE|
154|GPU_RECOVERY_ACTION_CHANGED|YYYY|XID_154|
155|NVLINK_SW_DEFINED_ERROR|NNYY|RESET_GPU|
156|RESOURCE_RETIREMENT_EVENT|NYYY|RESET_GPU|
157|RESOURCE_RETIREMENT_FAILURE|NYYY|IGNORE|
158|GPU_FATAL_TIMEOUT|YYYY|RESET_GPU|
159|ROBUST_CHANNEL_CHI_NON_DATA_ERROR|NNYY|CHECK_UVM|
160|CHANNEL_RETIREMENT_EVENT|NNYY|IGNORE|
161|CHANNEL_RETIREMENT_FAILURE|NNYY|IGNORE|
162|PSHC_REENGAGED|NNYY|-|
163|PSHC_DISENGAGED|NNYY|-|
164|PSHC_LOW_LIFETIME|NNYY|-|
165|PSHC_ZERO_LIFETIME|NNYY|-|
166|NVLINK_SECURE_CRYPTO_ERR|NNYY|-|
167|PCIE_FATAL_TIMEOUT|NYYY|-|
168|REDUCED_GPU_MEMORY_CAPACITY|YYYY|-|
169|SEC2_HALT_ERROR|NYYY|-|
170|NVLINK_SECURE_OTHER|NNYY|-|
171|UNCORRECTABLE_DRAM_ERROR|YYYY|-|
172|UNCORRECTABLE_SRAM_ERROR|YYYY|-|
"""


class CatalogRow(NamedTuple):
    """One row of the catalog's "Xids" sheet (see :data:`_CATALOG`)."""

    xid: int
    mnemonic: str
    applies: tuple[bool, bool, bool, bool]  # A100, H100, B100, GB200
    bucket: str | None  # immediate action; None where the catalog gives none
    unused: bool  # description "Unused"

    @property
    def deprecated(self) -> bool:
        """ "Unused" and applies to none of the four products: not described for them."""
        return self.unused and not any(self.applies)


def _load() -> dict[int, CatalogRow]:
    rows = {}
    for line in _CATALOG.strip().splitlines():
        code, mnemonic, applies, bucket, unused = line.split("|")
        rows[int(code)] = CatalogRow(
            xid=int(code),
            mnemonic=mnemonic,
            applies=tuple(c == "Y" for c in applies),  # type: ignore[arg-type]
            bucket=None if bucket == "-" else bucket,
            unused=unused == "U",
        )
    return rows


#: XID number -> its catalog row (1-172)
CATALOG: dict[int, CatalogRow] = _load()

NVLINK5_XIDS = frozenset(range(144, 151))

#: the XIDs that say the GPU left the bus: the catalog rows whose mnemonic says so (79,
#: ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS, "GPU has fallen off the bus"). With the
#: no-Xid "fallen off the bus" line (kernel reason ``fallen_off_bus``, which NVIDIA's own
#: NVSentinel treats as the same failure, NVIDIA/NVSentinel#155 and #195) these are the
#: kernel-log events that corroborate a GPU its NVML no longer lists
#: (``VendorActions.off_bus_codes``, hetpatrol.patrol's card_missing rule)
OFF_BUS_XIDS = frozenset(x for x, row in CATALOG.items() if "FALLEN_OFF_THE_BUS" in row.mnemonic)
#: the kernel-log reasons (no XID printed) that say the same
OFF_BUS_REASONS = frozenset({"fallen_off_bus"})


def xid_action(
    xid: int | str,
    *,
    fatal: bool | None = None,
    recovery_action: str | None = None,
    overrides: dict[str, str] | None = None,
) -> ActionVerdict:
    """The action for one XID.

    ``xid``: the XID number (int or decimal text); ``fatal``: for NVLink5 (144-150),
    whether the catalog's decode of the line is RESET_GPU (the XID finding is critical:
    :func:`hetpatrol.checks.kernel_events.classify` decodes IntrInfo and Error Status,
    the printed word only when the line cannot be decoded); None = not known: counted
    as fatal; ``recovery_action``:
    for XID 154, the text after "to" (``0x2 (Node Reboot Required)``) or just the name;
    ``overrides``: per-code action words from the config, keyed ``"xid:<n>"``.
    Never raises: text that is no number gives ``watch`` with the raw text.
    """
    try:
        number = int(str(xid).strip())
    except ValueError:
        return ActionVerdict(WATCH, "unknown", f"xid:{xid}", f"XID {xid!r} is not a number")
    code = f"xid:{number}"
    if overrides and code in overrides:
        return ActionVerdict(overrides[code], "override", code, "per-code override in the config")
    row = CATALOG.get(number)
    if row is None:
        return ActionVerdict(WATCH, "unknown", code, f"XID {number} is not in NVIDIA's catalog")
    if row.deprecated:
        return ActionVerdict(
            WATCH, "nvidia_xid", code, f"XID {number} {row.mnemonic}: catalog says Unused"
        )
    if row.bucket is None:
        return ActionVerdict(
            WATCH, "nvidia_xid", code, f"XID {number} {row.mnemonic}: no resolution bucket"
        )
    if row.bucket == "XID_154":
        verdict = recovery_action_from_text(recovery_action)
        return ActionVerdict(
            verdict.action, "nvidia_xid", code, f"XID 154 recovery action: {verdict.reason}"
        )
    if row.bucket == "WORKFLOW_NVLINK5_ERR":
        is_fatal = fatal is not False
        word = "Fatal" if fatal else ("Nonfatal" if fatal is False else "fatality not said")
        return ActionVerdict(
            RESET_CARD if is_fatal else WATCH,
            "nvidia_xid",
            code,
            f"XID {number} {row.mnemonic} {word}: WORKFLOW_NVLINK5_ERR",
        )
    return ActionVerdict(
        BUCKET_ACTION.get(row.bucket, WATCH),
        "nvidia_xid",
        code,
        f"XID {number} {row.mnemonic}: {row.bucket}",
    )


#: failures the driver prints without an XID number (hetpatrol.kernel_log reasons)
KERNEL_REASON_ACTION: dict[str, tuple[str, str]] = {
    # the same failure as XID 79 (catalog: RESTART_BM)
    "fallen_off_bus": (REBOOT_NODE, "GPU has fallen off the bus: as XID 79, RESTART_BM"),
    # NV_ERR_RESET_REQUIRED: the driver itself says the GPU needs a reset
    "reset_required": (RESET_CARD, "driver says NV_ERR_RESET_REQUIRED"),
    # RmInitAdapter failed: the GPU did not initialise, as XID 143 GPU_INIT_ERROR
    # (catalog: RESET_GPU)
    "rm_init_adapter_failed": (RESET_CARD, "RmInitAdapter failed: as XID 143, RESET_GPU"),
}


def kernel_reason_action(reason: str | None) -> ActionVerdict:
    """The action of a kernel-log failure without an XID (``fallen_off_bus`` ...);
    ``watch`` with the raw reason for one hetpatrol does not know."""
    found = KERNEL_REASON_ACTION.get(reason or "")
    if found is None:
        return ActionVerdict(WATCH, "unknown", f"kernel:{reason}", "kernel fault not known")
    return ActionVerdict(found[0], "nvidia_kernel", f"kernel:{reason}", found[1])
