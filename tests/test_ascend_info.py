"""``npu-smi info`` parsing and the Ascend collector, against the recorded samples.

The samples are read in place from ``../shared/vendor-samples/ascend/`` (beside the
checkout). Every expected value below was read off the sample text by hand: MiB as
printed ("MB" columns), converted to bytes here.
"""

from __future__ import annotations

import os
import random
import stat
from dataclasses import dataclass
from pathlib import Path

import pytest

from hetpatrol.collector import STATE_ABSENT, STATE_OK, CollectorError
from hetpatrol.collectors.ascend import (
    AscendCollector,
    card_type_for,
    dcmi_return_code,
    parse_npu_smi_info,
)
from hetpatrol.tool import ToolOutput

MIB = 1048576
VENDOR = Path(__file__).resolve().parents[1].parent / "shared" / "vendor-samples"
ASCEND = VENDOR / "ascend"


@pytest.fixture(scope="module")
def samples() -> Path:
    if not ASCEND.is_dir():
        if os.environ.get("CI") == "true":
            pytest.fail(f"vendor samples missing at {ASCEND} (required under CI=true)")
        pytest.skip(f"vendor samples not found at {ASCEND} (clone without ../shared)")
    return ASCEND


def read(samples: Path, name: str) -> str:
    return (samples / name).read_text(encoding="utf-8")


# ----------------------------------------------------------------------------- expectations


@dataclass(frozen=True)
class Chip:
    npu: int
    chip: int
    model: str
    health: str
    power: float | None  # None: the sample prints NA or -
    temp: float
    hugepages: tuple[int, int] | None  # None: no Hugepages column (20.2.0)
    bus: str | None  # as printed; None for NA
    used_mib: int
    total_mib: int
    kind: str  # "hbm" or "ddr"
    phy: int | None = None
    device: int | None = None
    complete: bool = True


@dataclass(frozen=True)
class Sample:
    tool: str | None
    driver: str | None
    card_type: str
    chips: list[Chip]
    truncated: bool = False
    # (npu, chip, pid, name-or-None, MiB, pid in container)
    procs: tuple[tuple[int, int, int, str | None, int, int | None], ...] = ()
    known: frozenset[int] | None = None  # NPUs whose processes are known; None = all
    problems: int = 0


def _1chip(name: str, health: str, rows, hp, total, kind="hbm") -> list[Chip]:
    """Single-chip NPUs: rows = (npu, power, temp, bus, used MiB)."""
    return [
        Chip(n, 0, name, health, p, t, hp, bus, used, total, kind) for n, p, t, bus, used in rows
    ]


def _a3(rows) -> list[Chip]:
    """A3 rows = (npu, chip, phy, power, temp, bus, used MiB), HBM total 65536."""
    return [
        Chip(n, c, "Ascend910", "OK", p, t, (0, 0), bus, used, 65536, "hbm", phy=phy)
        for n, c, phy, p, t, bus, used in rows
    ]


EXPECTED: dict[str, Sample] = {
    "npu-smi-info_310B4_1card_Alarm_v23.0.0.txt": Sample(
        "23.0.0",
        "23.0.0",
        "310b",
        [Chip(0, 0, "310B4", "Alarm", 0.0, 65, (15, 15), None, 3628, 15609, "ddr", device=0)],
        known=frozenset(),
    ),
    "npu-smi-info_310P3-Duo_1card-2chip_shared-busid_PowerNA_TAIL-CUT_v25.2.0.txt": Sample(
        "25.2.0",
        "25.2.0",
        "310p",
        [
            Chip(
                2, 0, "310P3", "OK", None, 45, (0, 0), "0000:01:00.0", 1529, 44280, "ddr", device=0
            ),
            Chip(
                2, 1, "310P3", "OK", None, 43, (0, 0), "0000:01:00.0", 1412, 43693, "ddr", device=1
            ),
        ],
        truncated=True,
        known=frozenset(),
        problems=1,
    ),
    "npu-smi-info_310P3-Duo_hugepages-full_TAIL-CUT_v25.5.0.txt": Sample(
        "25.5.0",
        "25.5.0",
        "310p",
        [
            Chip(
                0,
                0,
                "310P3",
                "OK",
                None,
                58,
                (18047, 18047),
                "0000:01:00.0",
                37623,
                44278,
                "ddr",
                device=0,
            ),
            # second chip: line 1 complete, line 2 cut after "| 1       1"
            Chip(0, 1, "310P3", "OK", None, 58, (18135, 18135), None, 0, 0, "", complete=False),
        ],
        truncated=True,
        known=frozenset(),
        problems=2,
    ),
    "npu-smi-info_310P3_1card_94col-layout_tool22.0.0-drv22.0.2.txt": Sample(
        "22.0.0",
        "22.0.2",
        "310p",
        [Chip(0, 0, "310P3", "OK", 17.1, 55, (0, 0), "0000:87:00.0", 927, 23054, "ddr", device=0)],
        known=frozenset(),
    ),
    "npu-smi-info_310P3_1card_cardid32896_PowerNA_v25.5.2.txt": Sample(
        "25.5.2",
        "25.5.2",
        "310p",
        [
            Chip(
                32896,
                0,
                "310P3",
                "OK",
                None,
                54,
                (0, 0),
                "0000:00:00.0",
                1904,
                44213,
                "ddr",
                device=0,
            )
        ],
    ),
    "npu-smi-info_310P3_1card_cardid7_VM-busid_MISALIGNED-HEADER_v22.0.4.txt": Sample(
        "22.0.4",
        "22.0.4",
        "310p",
        [Chip(7, 0, "310P3", "OK", None, 28, (0, 0), "0000:00:07.0", 1805, 21527, "ddr", device=0)],
        known=frozenset(),
    ),
    "npu-smi-info_310P3_2card_HEADER-CUT_noversion.txt": Sample(
        None,
        None,
        "310p",
        [
            Chip(
                0, 0, "310P3", "OK", 15.8, 42, (0, 0), "0000:82:00.0", 1074, 21534, "ddr", device=0
            ),
            Chip(
                1, 0, "310P3", "OK", 15.4, 43, (0, 0), "0000:89:00.0", 1070, 21534, "ddr", device=1
            ),
        ],
        truncated=True,
        known=frozenset(),
        problems=1,
    ),
    "npu-smi-info_310_Atlas300-3000_1card-4chip_cardid215_v20.2.0.txt": Sample(
        "20.2.0",
        "20.2.0",
        "310",
        [
            Chip(215, 0, "310", "OK", 12.8, 56, None, "0000:DA:00.0", 2703, 8192, "ddr", device=0),
            Chip(215, 1, "310", "OK", 12.8, 57, None, "0000:DC:00.0", 2703, 8192, "ddr", device=1),
            Chip(215, 2, "310", "OK", 12.8, 57, None, "0000:DD:00.0", 2703, 8192, "ddr", device=2),
            Chip(215, 3, "310", "OK", 12.8, 55, None, "0000:DB:00.0", 2703, 8192, "ddr", device=3),
        ],
        known=frozenset(),
    ),
    "npu-smi-info_310_Atlas300-3000_1card-4chip_hugepages_ragged_v21.0.4.txt": Sample(
        "21.0.4",
        "21.0.4.B030",
        "310",
        [
            Chip(
                6, 0, "310", "OK", 12.8, 73, (0, 970), "0000:89:00.0", 2703, 8192, "ddr", device=3
            ),
            Chip(
                6, 1, "310", "OK", 12.8, 74, (0, 970), "0000:8A:00.0", 2867, 8192, "ddr", device=4
            ),
            Chip(
                6, 2, "310", "OK", 12.8, 70, (0, 970), "0000:8B:00.0", 2867, 8192, "ddr", device=5
            ),
            Chip(
                6, 3, "310", "OK", 12.8, 65, (0, 970), "0000:8C:00.0", 2867, 8192, "ddr", device=6
            ),
        ],
        known=frozenset(),
    ),
    "npu-smi-info_310x-SoC_1card_ChipDevice_BusIdNA_DOC-EDITED_vxxx.txt": Sample(
        "xxx",
        "xxx",
        "ascend",
        [Chip(0, 0, "xxx", "OK", 10.4, 66, (0, 0), None, 957, 10810, "ddr", device=0)],
        known=frozenset(),
    ),
    "npu-smi-info_910-32GB_8card_Health-Warning_DOC-EDITED_v23.0.5.txt": Sample(
        "23.0.5",
        "23.0.5",
        "ascend",
        [
            Chip(0, 0, "xxx", "Warning", 73.1, 37, (0, 0), "0000:61:00.0", 0, 32768, "hbm"),
            Chip(7, 0, "xxx", "OK", 67.0, 38, (0, 0), "0000:3D:00.0", 0, 32768, "hbm"),
        ],
        problems=2,  # the two "..." elision lines
    ),
    "npu-smi-info_910-32GB_8card_procs_hugepages_tool-vs-driver-version-mismatch_v23.0.rc3.txt": (
        Sample(
            "23.0.rc3",
            "23.0.rc2.3",
            "ascend",
            _1chip(
                "xxx",
                "OK",
                [
                    (0, 73.4, 44, "0000:C1:00.0", 30710),
                    (1, 69.6, 39, "0000:81:00.0", 30710),
                    (2, 70.0, 36, "0000:41:00.0", 30710),
                    (3, 69.6, 44, "0000:01:00.0", 30709),
                    (4, 71.3, 40, "0000:C2:00.0", 30709),
                    (5, 67.0, 36, "0000:82:00.0", 30709),
                    (6, 71.7, 37, "0000:42:00.0", 30710),
                    (7, 69.1, 42, "0000:02:00.0", 30710),
                ],
                (1123, 1123),
                32768,
            ),
            procs=(
                (0, 0, 139667, "python", 30780, None),
                (1, 0, 139577, "python", 30782, None),
                (2, 0, 139446, "python", 30780, None),
                (3, 0, 139372, "python", 30780, None),
                (4, 0, 139258, "python", 30780, None),
                (5, 0, 139163, "python", 30780, None),
                (6, 0, 139126, "python", 30780, None),
                (7, 0, 139090, "python", 30780, None),
            ),
        )
    ),
    "npu-smi-info_910A-xxx_8card_Health-Warning_32procs_DOC-EDITED_v24.1.RC2.txt": Sample(
        "24.1.RC2",
        "24.1.RC2",
        "ascend",
        [
            Chip(0, 0, "xxx", "OK", 70.5, 42, (1232, 1232), "0000:C1:00.0", 0, 32768, "hbm"),
            Chip(1, 0, "xxx", "OK", 71.2, 36, (1232, 1232), "0000:81:00.0", 0, 32768, "hbm"),
            Chip(2, 0, "xxx", "OK", 69.0, 35, (1232, 1232), "0000:41:00.0", 0, 32768, "hbm"),
            Chip(3, 0, "xxx", "Warning", 206.9, 39, (1232, 1232), "0000:01:00.0", 0, 32768, "hbm"),
            Chip(4, 0, "xxx", "OK", 70.2, 39, (1232, 1232), "0000:C2:00.0", 0, 32768, "hbm"),
            Chip(5, 0, "xxx", "OK", 64.9, 37, (1232, 1232), "0000:82:00.0", 0, 32768, "hbm"),
            Chip(6, 0, "xxx", "OK", 69.4, 40, (1232, 1232), "0000:42:00.0", 0, 32768, "hbm"),
            Chip(7, 0, "xxx", "Warning", 203.2, 42, (1232, 1232), "0000:02:00.0", 0, 32768, "hbm"),
        ],
        procs=tuple(
            (npu, 0, pid, "hlt_host_devmm_", 686, None)
            for npu, pids in [
                (0, (37656, 37664, 37640, 37648)),
                (1, (37665, 37641, 37649, 37657)),
                (2, (37658, 37650, 37666, 37642)),
                (3, (37643, 37651, 37659, 37667)),
                (4, (37668, 37644, 37652, 37660)),
                (5, (37653, 37661, 37669, 37645)),
                (6, (37646, 37654, 37662, 37670)),
                (7, (37671, 37647, 37655, 37663)),
            ]
            for pid in pids
        ),
    ),
    "npu-smi-info_910A_8card_noproctable_v22.0.3.1.txt": Sample(
        "22.0.3.1",
        "22.0.3.1",
        "910",
        _1chip(
            "910A",
            "OK",
            [
                (0, 67.2, 43, "0000:61:00.0", 0),
                (1, 63.3, 38, "0000:DB:00.0", 0),
                (2, 64.8, 34, "0000:B2:00.0", 0),
                (3, 191.7, 42, "0000:3E:00.0", 0),
                (4, 66.4, 44, "0000:60:00.0", 0),
                (5, 62.7, 33, "0000:DA:00.0", 0),
                (6, 64.5, 35, "0000:B1:00.0", 0),
                (7, 191.4, 40, "0000:3D:00.0", 0),
            ],
            (15, 15),
            32768,
        ),
        known=frozenset(),
    ),
    "npu-smi-info_910B2C_2card_procrow_v23.0.2.1.txt": Sample(
        "23.0.2.1",
        "23.0.2.1",
        "910b",
        _1chip(
            "910B2C",
            "OK",
            [(0, 88.6, 51, "0000:5A:00.0", 20701), (1, 99.6, 50, "0000:19:00.0", 20687)],
            (0, 0),
            65536,
        ),
        procs=((0, 0, 124528, "python3.8", 17400, None),),
        # NPU 1 is not listed and no later NPU is: not provably idle
        known=frozenset({0}),
    ),
    "npu-smi-info_910B2_8card_HBM-used-but-no-procs-visible_v23.0.7.txt": Sample(
        "23.0.7",
        "23.0.7",
        "910b",
        _1chip(
            "910B2",
            "OK",
            [
                (0, 96.5, 36, "0000:C1:00.0", 29954),
                (1, 98.7, 37, "0000:01:00.0", 29951),
                (2, 94.2, 35, "0000:C2:00.0", 29950),
                (3, 91.5, 38, "0000:02:00.0", 29951),
                (4, 96.6, 36, "0000:81:00.0", 3347),
                (5, 96.0, 39, "0000:41:00.0", 3350),
                (6, 97.5, 35, "0000:82:00.0", 3347),
                (7, 93.8, 37, "0000:42:00.0", 3347),
            ],
            (0, 0),
            65536,
        ),
    ),
    "npu-smi-info_910B3_8card_noproctable-CUT_v24.1.rc1.b030.txt": Sample(
        "24.1.rc1.b030",
        "24.1.rc1.b030",
        "910b",
        _1chip(
            "910B3",
            "OK",
            [
                (0, 101.8, 43, "0000:C1:00.0", 3318),
                (1, 92.0, 39, "0000:C2:00.0", 3314),
                (2, 102.0, 40, "0000:81:00.0", 3314),
                (3, 99.8, 40, "0000:82:00.0", 3314),
                (4, 98.6, 45, "0000:01:00.0", 3314),
                (5, 99.7, 44, "0000:02:00.0", 3314),
                (6, 103.8, 45, "0000:41:00.0", 3314),
                (7, 98.2, 44, "0000:42:00.0", 3315),
            ],
            (0, 0),
            65536,
        ),
        known=frozenset(),  # device table complete; process table absent -> unknown
    ),
    "npu-smi-info_910B3_8card_proc-noname_v25.2.0.txt": Sample(
        "25.2.0",
        "25.2.0",
        "910b",
        _1chip(
            "910B3",
            "OK",
            [
                (0, 97.9, 34, "0000:C1:00.0", 3408),
                (1, 89.5, 32, "0000:C2:00.0", 3408),
                (2, 92.3, 32, "0000:81:00.0", 41052),
                (3, 92.4, 32, "0000:82:00.0", 3390),
                (4, 95.6, 37, "0000:01:00.0", 3403),
                (5, 97.2, 38, "0000:02:00.0", 3400),
                (6, 91.0, 36, "0000:41:00.0", 3401),
                (7, 95.4, 37, "0000:42:00.0", 3400),
            ],
            (0, 0),
            65536,
        ),
        procs=((2, 0, 1333928, None, 37709, None),),
    ),
    "npu-smi-info_910B4-1_2npu_busid-masked-xx_TAIL-CUT_v25.2.0.txt": Sample(
        "25.2.0",
        "25.2.0",
        "910b",
        _1chip(
            "910B4-1",
            "OK",
            [(0, 91.3, 33, "0000:xx:00.0", 3197), (1, 88.1, 32, "0000:xx:00.0", 3197)],
            (0, 0),
            65536,
        ),
        truncated=True,
        known=frozenset(),
        problems=1,
    ),
    "npu-smi-info_910B4-32GB_2npu_HBM-busy_TAIL-CUT_v24.1.1.txt": Sample(
        "24.1.1",
        "24.1.1",
        "910b",
        _1chip(
            "910B4",
            "OK",
            [(0, 88.2, 30, "0000:C1:00.0", 26838), (1, 87.0, 30, "0000:C2:00.0", 29356)],
            (0, 0),
            32768,
        ),
        truncated=True,
        known=frozenset(),
        problems=1,
    ),
    "npu-smi-info_910B4_1card_wide114_TAIL-CUT_v26.0.rc1.txt": Sample(
        "26.0.rc1",
        "26.0.rc1",
        "910b",
        _1chip("910B4", "OK", [(0, 82.6, 32, "0000:C1:00.0", 2871)], (0, 0), 32768),
        truncated=True,
        known=frozenset({0}),  # its "No running processes found in NPU 0" row is complete
        problems=1,
    ),
    "npu-smi-info_910B4_8card_Atlas800IA2_idle_v25.0.rc1.1.txt": Sample(
        "25.0.rc1.1",
        "25.0.rc1.1",
        "910b",
        _1chip(
            "910B4",
            "OK",
            [
                (0, 87.2, 33, "0000:C1:00.0", 2654),
                (1, 82.7, 33, "0000:C2:00.0", 2654),
                (2, 82.7, 33, "0000:81:00.0", 2654),
                (3, 89.1, 34, "0000:82:00.0", 2654),
                (4, 84.5, 39, "0000:01:00.0", 2654),
                (5, 84.8, 37, "0000:02:00.0", 2654),
                (6, 87.1, 38, "0000:41:00.0", 2654),
                (7, 81.6, 37, "0000:42:00.0", 2653),
            ],
            (0, 0),
            32768,
        ),
    ),
    "npu-smi-info_910_93-A3_16chip_HEAD-ONLY_wide_v26.0.rc2.txt": Sample(
        "26.0.rc2",
        "26.0.rc2",
        "910_93",
        _a3(
            [(0, 0, 0, 162.6, 34, "0000:9D:00.0", 3419), (0, 1, 1, None, 34, "0000:9F:00.0", 2874)]
        ),
        truncated=True,
        known=frozenset(),
        problems=1,
    ),
    "npu-smi-info_910_93-A3_16chip_TAIL-ONLY_5col-proctable_v26.0.rc2.txt": Sample(
        None,
        None,
        "910_93",
        # no header rows: the unlabelled Phy-ID (15) is not attributed
        [Chip(7, 1, "Ascend910", "OK", None, 35, (0, 0), "0000:83:00.0", 31877, 65536, "hbm")],
        truncated=True,
        procs=((0, 0, 632268, "python3.1", 197, None),),
        known=frozenset({0, 1}),
        problems=5,  # + NPU 0, 1 named by the process table, their device rows cut
    ),
    "npu-smi-info_910_93-A3_1npu-2chip_ProcIdInContainer_DOC-EDITED_vxxx.txt": Sample(
        "xxx.xxx.xxx",
        "xxx.xxx.xxx",
        "ascend",
        [
            Chip(0, 0, "xxx", "OK", 157.3, 32, (0, 0), "0000:9D:00.0", 3130, 65536, "hbm", phy=0),
            Chip(0, 1, "xxx", "OK", None, 32, (0, 0), "0000:9D:00.0", 3130, 65536, "hbm", phy=0),
        ],
    ),
    "npu-smi-info_910_93-A3_2npu-4chip_PhyID_procrow_v25.2.0.txt": Sample(
        "25.2.0",
        "25.2.0",
        "910_93",
        _a3(
            [
                (0, 0, 0, 162.8, 37, "0000:9C:00.0", 3133),
                (0, 1, 1, None, 37, "0000:9E:00.0", 2876),
                (1, 0, 2, 167.1, 38, "0000:37:00.0", 3116),
                (1, 1, 3, None, 38, "0000:39:00.0", 10568),
            ]
        ),
        procs=((1, 1, 990711, "python", 7746, None),),
    ),
    "npu-smi-info_910_93-A3_8npu-16chip_idle_v24.1.rc3.5.txt": Sample(
        "24.1.rc3.5",
        "24.1.rc3.5",
        "910_93",
        _a3(
            [
                (0, 0, 0, 180.2, 38, "0000:9D:00.0", 3430),
                (0, 1, 1, None, 37, "0000:9F:00.0", 3188),
                (1, 0, 2, 185.9, 39, "0000:99:00.0", 3430),
                (1, 1, 3, None, 37, "0000:9B:00.0", 3188),
                (2, 0, 4, 173.4, 36, "0000:95:00.0", 3427),
                (2, 1, 5, None, 37, "0000:97:00.0", 3187),
                (3, 0, 6, 176.2, 36, "0000:91:00.0", 3425),
                (3, 1, 7, None, 36, "0000:93:00.0", 3191),
                (4, 0, 8, 178.3, 36, "0000:8D:00.0", 3414),
                (4, 1, 9, None, 36, "0000:8F:00.0", 3201),
                (5, 0, 10, 178.4, 37, "0000:89:00.0", 3415),
                (5, 1, 11, None, 37, "0000:8B:00.0", 3203),
                (6, 0, 12, 176.0, 36, "0000:85:00.0", 3413),
                (6, 1, 13, None, 37, "0000:87:00.0", 3201),
                (7, 0, 14, 181.1, 38, "0000:81:00.0", 3427),
                (7, 1, 15, None, 36, "0000:83:00.0", 3187),
            ]
        ),
    ),
}

ERROR_SAMPLES = {
    "npu-smi-info_error_dcmi-init-8005_after-fw-upgrade-no-reboot.txt": -8005,
    "npu-smi-info_error_dcmi-init-8005_container-no-privileged.txt": -8005,
    "npu-smi-info_error_non-root-user_ret4_-8005_RECONSTRUCTED_v25.5.2.txt": -8005,
}


def test_every_table_sample_has_expectations(samples: Path) -> None:
    names = {p.name for p in samples.glob("npu-smi-info_*.txt")}
    assert names == set(EXPECTED) | set(ERROR_SAMPLES)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_parse_sample(samples: Path, name: str) -> None:
    exp = EXPECTED[name]
    info = parse_npu_smi_info(read(samples, name))
    assert (info.tool_version, info.driver_version) == (exp.tool, exp.driver)
    assert info.truncated is exp.truncated
    assert len(info.problems) == exp.problems, info.problems
    assert [(c.npu_id, c.chip_id) for c in info.chips] == [(c.npu, c.chip) for c in exp.chips]
    for got, want in zip(info.chips, exp.chips, strict=True):
        assert got.complete is want.complete
        assert got.name == want.model
        assert got.health == want.health
        assert got.power_watts == want.power
        assert got.temperature_celsius == want.temp
        assert (got.phy_id, got.device_id) == (want.phy, want.device)
        hp = (got.hugepages_used, got.hugepages_total)
        assert hp == (want.hugepages or (None, None))
        if want.complete:
            assert got.bus_id == (want.bus or "NA")
            assert got.aicore_percent == 0.0
            used_total = (
                (got.hbm_used_mib, got.hbm_total_mib)
                if want.kind == "hbm"
                else (got.memory_used_mib, got.memory_total_mib)
            )
            assert used_total == (want.used_mib, want.total_mib)
    got_procs = [
        (p.npu_id, p.chip_id, p.pid, p.name or None, p.memory_mib, p.pid_in_container)
        for p in info.processes
    ]
    assert got_procs == list(exp.procs)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_records_from_sample(samples: Path, name: str) -> None:
    exp = EXPECTED[name]
    records = AscendCollector.records_from(parse_npu_smi_info(read(samples, name)))
    assert len(records) == len(exp.chips)
    for rec, want in zip(records, exp.chips, strict=True):
        errors = {e["source"]: e["error"] for e in rec.errors}
        assert rec.vendor == "ascend"
        assert (rec.index, rec.chip, rec.model) == (want.npu, want.chip, want.model)
        assert rec.card_type == exp.card_type
        assert rec.vendor_health == want.health
        assert rec.health == "unknown"  # judged later by the thresholds
        assert rec.driver_version == exp.driver
        assert rec.temperature_celsius == want.temp
        assert rec.power_watts == want.power
        if want.power is None:
            assert errors["npu-smi info Power(W)"].startswith(("NA", "-"))
        assert rec.read_ok is want.complete
        if not want.complete:
            assert "npu-smi info" in errors
            assert rec.memory_total_bytes is None
            continue
        assert rec.bus_id == (want.bus.lower() if want.bus else None)
        assert rec.utilization_ratio == 0.0
        assert rec.memory_kind == want.kind
        assert rec.memory_used_bytes == want.used_mib * MIB
        assert rec.memory_total_bytes == want.total_mib * MIB
        hp = want.hugepages or (None, None)
        assert (rec.hugepages_used, rec.hugepages_total) == hp
        assert rec.counters == {}
        procs = [
            (want.npu, want.chip, p.pid, p.name, p.memory_bytes // MIB, p.pid_in_container)
            for p in rec.processes
        ]
        assert procs == [p for p in exp.procs if p[:2] == (want.npu, want.chip)]
        assert all(p.memory_bytes % MIB == 0 for p in rec.processes)
        known = exp.known is None or want.npu in exp.known
        assert ("npu-smi info processes" not in errors) is known


@pytest.mark.parametrize("name", sorted(ERROR_SAMPLES))
def test_error_samples_raise(samples: Path, name: str) -> None:
    text = read(samples, name)
    with pytest.raises(CollectorError) as err:
        parse_npu_smi_info(text)
    assert err.value.raw == text
    assert "-8005" in str(err.value)
    assert "dcmi module initialize failed" in str(err.value)
    assert dcmi_return_code(text) == ERROR_SAMPLES[name]


@pytest.mark.parametrize(
    "text, needle",
    [
        ("", "printed nothing"),
        ("\n  \n", "printed nothing"),
        ("Invalid card id.\n", "no NPU table"),
        ("hello world\nfoo | bar\n", "no NPU table"),
        ("+------+\n| NPU   Name | Health | Power(W) |\n+======+\n", "header but no device"),
        ("| a | b | c |\n| d | e | f |\n", "no NPU table"),
    ],
)
def test_garbage_raises(text: str, needle: str) -> None:
    with pytest.raises(CollectorError) as err:
        parse_npu_smi_info(text)
    assert needle in str(err.value)
    assert err.value.raw == text


# ----------------------------------------------------------------------------- robustness


def _prefix_cuts(text: str) -> list[int]:
    cuts: set[int] = set()
    pos = 0
    for line in text.splitlines(keepends=True):
        cuts.update({pos, pos + 1, pos + 2, pos + len(line) // 2, pos + len(line) - 2})
        pos += len(line)
    return sorted(k for k in cuts if 0 <= k <= len(text))


ROBUST = [
    "npu-smi-info_310P3-Duo_1card-2chip_shared-busid_PowerNA_TAIL-CUT_v25.2.0.txt",
    "npu-smi-info_310_Atlas300-3000_1card-4chip_cardid215_v20.2.0.txt",
    "npu-smi-info_910A-xxx_8card_Health-Warning_32procs_DOC-EDITED_v24.1.RC2.txt",
    "npu-smi-info_910B3_8card_proc-noname_v25.2.0.txt",
    "npu-smi-info_910_93-A3_2npu-4chip_PhyID_procrow_v25.2.0.txt",
]


@pytest.mark.parametrize("name", ROBUST)
def test_cut_output_never_invents_values(samples: Path, name: str) -> None:
    """Any prefix parses or raises CollectorError; a chip marked complete equals the one
    read from the whole output; known processes equal the whole output's; a prefix cut
    anywhere but right after a border is flagged truncated."""
    text = read(samples, name)
    full = parse_npu_smi_info(text)
    for k in _prefix_cuts(text):
        cut = text[:k]
        try:
            info = parse_npu_smi_info(cut)
        except CollectorError as exc:
            assert "internal parser error" not in str(exc)
            continue
        AscendCollector.records_from(info)
        for got, whole in zip(info.chips, full.chips, strict=False):
            assert got.npu_id == whole.npu_id
            if got.complete:
                assert got == whole, k
        for npu in {c.npu_id for c in info.chips}:
            if info.processes_known(npu):
                assert full.processes_known(npu)
                assert [p for p in info.processes if p.npu_id == npu] == [
                    p for p in full.processes if p.npu_id == npu
                ]
        if cut.strip() != text.strip() and not cut.rstrip().endswith("+"):
            assert info.truncated, k


def test_random_damage_never_escapes(samples: Path) -> None:
    rng = random.Random(20240601)
    texts = [read(samples, n) for n in ROBUST]
    for i in range(400):
        chars = list(texts[i % len(texts)])
        for _ in range(rng.randint(1, 6)):
            j = rng.randrange(len(chars))
            op = rng.random()
            if op < 0.3:
                chars[j] = chr(rng.randrange(0, 0x3000))
            elif op < 0.5:
                del chars[j]
            else:
                chars.insert(j, rng.choice("|+-=/ \t\r\n0123456789NA"))
        lines = "".join(chars).split("\n")
        if i % 3 == 0:
            a, b = rng.randrange(len(lines)), rng.randrange(len(lines))
            lines[a], lines[b] = lines[b], lines[a]
        if i % 5 == 0:
            lines.insert(rng.randrange(len(lines)), "")
        sep = "\r\n" if i % 4 == 0 else "\n"
        try:
            info = parse_npu_smi_info(sep.join(lines))
        except CollectorError as exc:
            assert "internal parser error" not in str(exc)
            continue
        for rec in AscendCollector.records_from(info):
            rec.to_dict()


def test_crlf_tabs_and_blank_lines_parse_the_same(samples: Path) -> None:
    name = "npu-smi-info_910_93-A3_2npu-4chip_PhyID_procrow_v25.2.0.txt"
    text = read(samples, name)
    mangled = "\r\n\r\n".join(line.replace("    ", "\t") for line in text.splitlines()) + "\t\r\n"
    a, b = parse_npu_smi_info(text), parse_npu_smi_info(mangled)
    assert a.chips == b.chips and a.processes == b.processes
    assert not b.truncated and not b.problems


def test_dcmi_text_before_a_table_is_a_problem_not_a_failure(samples: Path) -> None:
    text = read(samples, "npu-smi-info_910B2C_2card_procrow_v23.0.2.1.txt")
    info = parse_npu_smi_info("DrvMngGetConsoleLogLevel failed. (ret=4)\n" + text)
    assert len(info.chips) == 2
    assert any("DrvMngGetConsoleLogLevel" in p for p in info.problems)


# ----------------------------------------------------------------------------- card type


@pytest.mark.parametrize(
    "name, chips, phy, expected",
    [
        ("910B1", 1, False, "910b"),
        ("910B2", 1, False, "910b"),
        ("910B2C", 1, False, "910b"),
        ("910B3", 1, False, "910b"),
        ("910B4", 1, False, "910b"),
        ("910B4-1", 1, False, "910b"),
        ("910A", 1, False, "910"),
        ("910ProA", 1, False, "910"),
        ("910ProB", 1, False, "910"),
        ("910", 1, False, "910"),
        ("Ascend910", 2, True, "910_93"),
        ("Ascend910", 2, False, "910_93"),
        ("Ascend910", 1, True, "910_93"),
        ("Ascend 910B3", 1, False, "910b"),
        ("310P1", 1, False, "310p"),
        ("310P3", 2, False, "310p"),
        ("310B1", 1, False, "310b"),
        ("310B4", 1, False, "310b"),
        ("310", 4, False, "310"),
        ("xxx", 2, True, "ascend"),
        ("", 1, False, "ascend"),
        ("Ascend950DT", 1, False, "ascend"),
    ],
)
def test_card_type_for(name: str, chips: int, phy: bool, expected: str) -> None:
    assert card_type_for(name, chips, phy) == expected


# ----------------------------------------------------------------------------- collector


def _script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "fake-npu-smi"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_collector_replay(samples: Path, tmp_path: Path) -> None:
    name = "npu-smi-info_910_93-A3_2npu-4chip_PhyID_procrow_v25.2.0.txt"
    (tmp_path / "npu-smi-info.txt").write_text(read(samples, name))
    result = AscendCollector({}, replay_dir=tmp_path).collect()
    assert result.collector == "ascend"
    assert result.state == STATE_OK
    assert (result.error, result.raw) == (None, None)
    assert [(r.index, r.chip) for r in result.records] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert result.records[3].processes[0].pid == 990711


def test_collector_truncated_keeps_raw(samples: Path, tmp_path: Path) -> None:
    name = "npu-smi-info_310P3-Duo_hugepages-full_TAIL-CUT_v25.5.0.txt"
    text = read(samples, name)
    (tmp_path / "npu-smi-info.txt").write_text(text)
    result = AscendCollector({}, replay_dir=tmp_path).collect()
    assert result.state == STATE_OK
    assert result.raw == text
    assert result.error.startswith("npu-smi info output truncated")
    assert [r.read_ok for r in result.records] == [True, False]


def test_collector_replay_without_recording_is_absent(tmp_path: Path) -> None:
    result = AscendCollector({}, replay_dir=tmp_path).collect()
    assert result.state == STATE_ABSENT
    assert result.records == []


def test_collector_missing_program_is_absent(tmp_path: Path) -> None:
    result = AscendCollector({"command": [str(tmp_path / "no-such-npu-smi"), "info"]}).collect()
    assert result.state == STATE_ABSENT
    assert "not found" in result.error


def test_collector_hung_tool(tmp_path: Path) -> None:
    script = _script(tmp_path, "echo '+----partial'\nsleep 30")
    collector = AscendCollector({"command": [str(script)], "timeout_seconds": 1})
    with pytest.raises(CollectorError) as err:
        collector.collect()
    assert err.value.hung is True
    assert str(err.value) == "npu-smi info hung: killed after 1s"
    assert "+----partial" in err.value.raw


def test_collector_nonzero_exit(tmp_path: Path) -> None:
    script = _script(
        tmp_path, "echo 'dcmi module initialize failed. ret is -8005'\necho oops >&2\nexit 1"
    )
    with pytest.raises(CollectorError) as err:
        AscendCollector({"command": [str(script)]}).collect()
    assert err.value.hung is False
    assert "exited with code 1" in str(err.value) and "-8005" in str(err.value)
    assert "ret is -8005" in err.value.raw and "oops" in err.value.raw


def _runner(stdout: str, code: int = 0):
    def run(argv, timeout_seconds):
        return ToolOutput(tuple(argv), stdout, "", code, False, 0.01)

    return run


def test_collector_injected_runner_parse_failure_keeps_raw() -> None:
    collector = AscendCollector({})
    collector.runner = _runner("dcmi module initialize failed. ret is -8005\n")
    with pytest.raises(CollectorError) as err:
        collector.collect()
    assert "-8005" in str(err.value)
    assert err.value.raw.startswith("dcmi module initialize failed")


def test_collector_not_supported_is_absent() -> None:
    collector = AscendCollector({"command": "npu-smi info", "timeout_seconds": 3})
    collector.runner = _runner("dcmi get card list failed. ret is -8255\n", code=255)
    assert collector.command == ["npu-smi", "info"]
    result = collector.collect()
    assert result.state == STATE_ABSENT
    assert "-8255" in result.error


def test_huge_whitespace_cell_parses_in_linear_time(tmp_path):
    """A value cell with 200,000 spaces around a ``/`` (``\\s*/\\s*`` backtracked
    quadratically: 36 s for 160k, the daemon frozen). Run in a child with a 10 s
    limit, so a regression fails instead of hanging the suite."""
    import subprocess
    import sys

    from conftest import NODES

    text = (NODES / "ascend-roce-alarm" / "npu-smi-info.txt").read_text()
    old = "| 0     910B4               | OK            | 87.2        33                0    / 0"
    assert old in text
    bad = text.replace(old, old.replace("87.2        33", "87.2" + " " * 200_000 + "33"), 1)
    src = tmp_path / "info.txt"
    src.write_text(bad)
    code = (
        "import sys\n"
        "from hetpatrol.collectors.ascend import parse_npu_smi_info\n"
        "info = parse_npu_smi_info(open(sys.argv[1]).read())\n"
        "c = [c for c in info.chips if c.npu_id == 0][0]\n"
        "print(len(info.chips), c.power_watts, c.temperature_celsius)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(src)], capture_output=True, text=True, timeout=10
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["8", "87.2", "33.0"]


# ----------------------------------------------------------------------------- hostile input

_NPU0_LINE1 = "| 0     910B4               | OK            | 87.2        33                0    / 0"


def _healthy_mixed_with(old: str, new: str) -> str:
    from conftest import NODES

    text = (NODES / "healthy-mixed" / "npu-smi-info.txt").read_text()
    assert old in text
    return text.replace(old, new, 1)


@pytest.mark.parametrize("blank", ["  ", "\x00\x00"], ids=["spaces", "nuls"])
def test_empty_health_cell_is_unknown_never_ok(tmp_path: Path, base_config, blank: str) -> None:
    """An empty or NUL-filled Health cell (alignment kept) is not a healthy card."""
    from hetpatrol.judge import judge

    line = _NPU0_LINE1.replace("| OK ", f"| {blank} ")
    (tmp_path / "npu-smi-info.txt").write_text(_healthy_mixed_with(_NPU0_LINE1, line))
    result = AscendCollector({"detail": False}, replay_dir=tmp_path).collect()
    assert result.error == "npu-smi info: line 7: NPU 0: Health cell empty"
    assert result.raw is not None
    rec = result.records[0]
    assert (rec.index, rec.chip, rec.vendor_health, rec.read_ok) == (0, 0, "", True)
    assert (rec.power_watts, rec.temperature_celsius) == (87.2, 33.0)
    assert rec.errors == [{"source": "npu-smi info Health", "error": "empty: health not read"}]
    judge(rec, base_config)
    assert rec.health == "unknown"
    assert [(f.check, f.severity, f.value, f.message) for f in rec.findings] == [
        ("vendor_health", "unknown", "", "vendor health could not be read: empty value")
    ]
    others = [judge(r, base_config).health for r in result.records[1:]]
    assert others == ["ok"] * 7


def test_duplicate_npu_block_keeps_first_marked_unknown(tmp_path: Path, base_config) -> None:
    """A second block with the same NPU ID / Chip ID is vendor garbage: one record per
    (index, chip), the first kept but unknown, the repeat dropped and reported."""
    from hetpatrol.judge import judge

    block = (
        "| 0     910B4               | Alarm         | 90.0        50                0    / 0"
        "             |\n"
        "| 0                         | 0000:C1:00.0  | 0           0    / 0          2654 / 32768"
        "         |\n"
        "+===========================+===============+=============================="
        "======================+\n"
    )
    npu1 = "| 1     910B4               | OK            | 82.7"
    (tmp_path / "npu-smi-info.txt").write_text(_healthy_mixed_with(npu1, block + npu1))
    result = AscendCollector({"detail": False}, replay_dir=tmp_path).collect()
    keys = [(r.index, r.chip) for r in result.records]
    assert keys == [(i, 0) for i in range(8)]
    assert result.error == "npu-smi info: line 10: duplicate NPU 0 Chip 0: dropped"
    assert result.raw is not None
    rec = result.records[0]
    # the first block's values are kept, the repeat (Alarm, 90 W) is not mixed in
    assert (rec.vendor_health, rec.power_watts, rec.read_ok) == ("OK", 87.2, False)
    assert rec.errors == [
        {
            "source": "npu-smi info",
            "error": "table row damaged: duplicate: NPU 0 Chip 0 listed again at line 10: "
            "chip not fully read",
        }
    ]
    judge(rec, base_config)
    assert rec.health == "unknown"
    assert [(f.check, f.severity) for f in rec.findings] == [("card_unreadable", "unknown")]
    assert [judge(r, base_config).health for r in result.records[1:]] == ["ok"] * 7


def test_a_column_title_with_another_unit_is_not_read(tmp_path: Path) -> None:
    """`HBM-Usage(GB)` and `Temp(F)` were read as MB and °C (HBM 2654 GB "used" of
    32768 GB, 33 °C): such a column is unknown, its values not read, the reason said."""
    text = _healthy_mixed_with("HBM-Usage(MB)", "HBM-Usage(GB)").replace("Temp(C) ", "Temp(F) ")
    (tmp_path / "npu-smi-info.txt").write_text(text)
    result = AscendCollector({"detail": False}, replay_dir=tmp_path).collect()
    assert result.error == (
        "npu-smi info: unknown column 'Temp(F)': its values are not read; "
        "unknown column 'HBM-Usage(GB)': its values are not read"
    )
    rec = result.records[0]
    assert (rec.temperature_celsius, rec.memory_used_bytes, rec.memory_total_bytes) == (
        None,
        None,
        None,
    )
    assert (rec.power_watts, rec.utilization_ratio) == (87.2, 0.0)


def test_an_npu_named_only_by_the_process_table_lost_its_device_rows() -> None:
    """NPU 5's block gone from the device table, its "No running processes" row still
    there: rows were lost (a first patrol has no earlier list to miss it from)."""
    from conftest import NODES

    lines = (NODES / "healthy-mixed" / "npu-smi-info.txt").read_text().splitlines(True)
    assert lines[21].startswith("| 5     910B4")
    info = parse_npu_smi_info("".join(lines[:21] + lines[24:]))
    assert [c.npu_id for c in info.chips] == [0, 1, 2, 3, 4, 6, 7]
    assert info.truncated
    assert info.problems == [
        "NPU 5 in the process table but not in the device table: its rows were lost"
    ]


@pytest.mark.parametrize(
    ("cell", "used_mib", "total_mib", "reason"),
    [
        ("NA / NA", None, None, "'NA/NA': used and total not reported"),
        ("N/A / 65536", None, 65536, "'N/A/65536': used not reported"),
        ("3408 / NA", 3408, None, "'3408/NA': total not reported"),
    ],
)
def test_an_hbm_cell_saying_na_nulls_only_that_value(tmp_path, cell, used_mib, total_mib, reason):
    """NPU 2's HBM-Usage cell of the sick-mixed table (41052 / 65536 MB) as a driver
    prints it when it cannot say: the chip is read, every other value kept, only the
    memory value is null with the reason; the node is not unknown because of it."""
    import shutil
    from dataclasses import replace

    from conftest import NODES

    from hetpatrol.config import load_config
    from hetpatrol.patrol import Patroller

    node = tmp_path / "node"
    node.mkdir()
    text = (NODES / "sick-mixed" / "npu-smi-info.txt").read_text()
    row = (
        "| 0                         | 0000:81:00.0  "
        "| 0           0    / 0          41052/ 65536         |"
    )
    assert row in text
    (node / "npu-smi-info.txt").write_text(text.replace(row, row.replace("41052/ 65536", cell)))
    shutil.copy(NODES / "sick-mixed" / "scenario.yaml", node / "scenario.yaml")
    config = replace(load_config(), node="n", collectors=load_config().collectors[1:])
    patroller = Patroller(config, replay_dir=node)
    try:
        report = patroller.run()
    finally:
        patroller.close()
    npu2 = report.cards[2]
    assert (npu2.index, npu2.read_ok, npu2.health) == (2, True, "ok")
    assert (npu2.temperature_celsius, npu2.power_watts, npu2.bus_id) == (32, 92.3, "0000:81:00.0")
    assert npu2.memory_used_bytes == (None if used_mib is None else used_mib * MIB)
    assert npu2.memory_total_bytes == (None if total_mib is None else total_mib * MIB)
    assert npu2.errors == [{"source": "npu-smi info HBM-Usage(MB)", "error": reason}]
    assert [f.check for f in npu2.findings] == []
    # the node's verdict comes from NPU 5's Alarm (critical), not from an unknown chip
    assert report.health == "critical"
    assert [c.health for c in report.cards].count("unknown") == 0
    assert report.collectors[0].error is None


def test_a_ddr_memory_cell_saying_na_nulls_only_that_value():
    """The 310P3 sample (Memory-Usage 1904 / 44213 MB, no HBM column) with that cell
    ``NA / NA``: chip read, memory null with the reason."""
    from conftest import samples_dir

    text = (
        samples_dir("ascend") / "npu-smi-info_310P3_1card_cardid32896_PowerNA_v25.5.2.txt"
    ).read_text()
    assert "1904 / 44213" in text
    info = parse_npu_smi_info(text.replace("1904 / 44213", "NA   / NA   "))
    assert info.problems == []
    (rec,) = AscendCollector.records_from(info)
    assert (rec.read_ok, rec.temperature_celsius, rec.bus_id) == (True, 54, "0000:00:00.0")
    assert (rec.memory_used_bytes, rec.memory_total_bytes) == (None, None)
    assert {
        "source": "npu-smi info Memory-Usage(MB)",
        "error": "'NA/NA': used and total not reported",
    } in rec.errors
