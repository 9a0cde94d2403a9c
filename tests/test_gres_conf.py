"""``hetpatrol gres-conf``: the gres.conf lines per card class from the node's own patrol
(recorded scenarios and vendor samples), placement from a test-made sysfs tree,
``--check`` against an installed gres.conf and slurmctld's view, and the lines proven on
the real slurmd (``slurmd -G``) with device nodes the test makes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import slurm_cluster as _cluster
from conftest import samples_dir
from test_task_prolog import plan8

from hetpatrol.cli import main
from hetpatrol.collectors.gaudi import HL_FIELDS
from hetpatrol.config import load_config
from hetpatrol.patrol import Patroller
from hetpatrol.slurm.gres_conf import (
    CardLine,
    Plan,
    build_plan,
    check_gres_conf,
    check_registration,
    comment,
    gres_conf_text,
    render,
)
from hetpatrol.sysfs_pci import parse_cpulist, read_place, slurm_cores
from hetpatrol.tool import ToolOutput

REPO = Path(__file__).resolve().parents[1]
NODES = REPO / "fixtures" / "nodes"

# healthy-mixed, as recorded: GPUs (nvidia-smi -q -x pci_bus_id) and NPUs (npu-smi Bus-Id)
HM_GPUS = ["0000:19:00.0", "0000:3b:00.0", "0000:4c:00.0", "0000:5d:00.0",
           "0000:9b:00.0", "0000:bb:00.0", "0000:cb:00.0", "0000:db:00.0"]  # fmt: skip
HM_NPUS = ["0000:c1:00.0", "0000:c2:00.0", "0000:81:00.0", "0000:82:00.0",
           "0000:01:00.0", "0000:02:00.0", "0000:41:00.0", "0000:42:00.0"]  # fmt: skip


def sysfs(root: Path, places: dict[str, tuple[int, str, int | None]], cpus: dict) -> Path:
    """A sysfs tree: per bus id (numa_node, local_cpulist, renderD minor or None), and
    per CPU (physical_package_id, core_id)."""
    for bus, (numa, cpulist, render_minor) in places.items():
        d = root / "sys" / "bus" / "pci" / "devices" / bus
        d.mkdir(parents=True, exist_ok=True)
        (d / "numa_node").write_text(f"{numa}\n")
        (d / "local_cpulist").write_text(f"{cpulist}\n")
        if render_minor is not None:
            (d / "drm" / f"renderD{render_minor}").mkdir(parents=True)
            (d / "drm" / f"card{render_minor - 128}").mkdir()
    for cpu, (package, core) in cpus.items():
        t = root / "sys" / "devices" / "system" / "cpu" / f"cpu{cpu}" / "topology"
        t.mkdir(parents=True)
        (t / "physical_package_id").write_text(f"{package}\n")
        (t / "core_id").write_text(f"{core}\n")
    return root


def two_sockets() -> dict[int, tuple[int, int]]:
    """2 sockets x 48 cores x 2 threads, Linux numbering: cpu n and n+96 are one core."""
    return {n: ((n % 96) // 48, n % 48) for n in range(192)}


NUMA = {0: "0-47,96-143", 1: "48-95,144-191"}


def gres_conf(capsys, *argv: str) -> tuple[str, int]:
    code = main(["gres-conf", *argv])
    return capsys.readouterr().out, code


def lines_of(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith(("NodeName=", "GresTypes="))]


# ------------------------------------------------------------ the plugins' words
@pytest.mark.parametrize(
    "vendor",
    ["nvidia", "ascend", "amd", "hygon", "cambricon", "enflame", "gaudi", "iluvatar", "kunlunxin"],
)
def test_each_plugins_gres_file_is_one_of_its_device_nodes(vendor):
    """The File= family a plugin declares is a device node its reads open (or lies in a
    directory it opens: /dev/dri), so the unit's sandbox and gres.conf name the same."""
    from hetpatrol.collector import load_collector

    info = load_collector(vendor).vendor_info
    assert info.gres is not None
    paths = {d.path for d in info.device_nodes}
    assert info.gres.file in paths or any(info.gres.file.startswith(p + "/") for p in paths)
    assert info.gres.number in ("index", "device_number", "drm_render")
    # a vendor Slurm does not find itself says which variable a job needs, and where
    # that is documented
    if info.gres.autodetect is None:
        assert info.gres.visible_env and info.gres.visible_doc


# ------------------------------------------------------------------- placement
def test_cpulist_and_slurm_core_indices():
    assert parse_cpulist("0-3,8,10-11") == (0, 1, 2, 3, 8, 10, 11)
    assert parse_cpulist("") == ()
    for bad in ("0-", "a", "3-1", "0-99999999"):
        with pytest.raises(ValueError, match="not a cpulist"):
            parse_cpulist(bad)
    topo = two_sockets()
    # NUMA 1's 96 CPUs are the 48 cores of socket 1: Slurm's logical cores 48-95
    assert slurm_cores(parse_cpulist(NUMA[1]), topo) == tuple(range(48, 96))
    # core_id may have holes (0,1,2,8,9,10 on one socket): Slurm numbers cores in order
    holes = {0: (0, 0), 1: (0, 1), 2: (0, 8), 3: (0, 9), 4: (1, 0), 5: (1, 8)}
    assert slurm_cores((3, 5), holes) == (3, 5)
    assert slurm_cores((2, 4), holes) == (2, 4)
    with pytest.raises(ValueError, match="cpu7: no topology"):
        slurm_cores((7,), holes)


def test_placement_that_cannot_be_read_is_said(tmp_path):
    root = sysfs(tmp_path, {"0000:19:00.0": (-1, "0-3", None)}, {})
    place = read_place(root, "0000:19:00.0")
    assert (place.numa_node, place.local_cpus) == (None, (0, 1, 2, 3))
    assert "-1 (the firmware names no NUMA node)" in place.error
    place = read_place(root, "0000:3b:00.0")
    assert place.local_cpus is None and "no such PCI function" in place.error


# -------------------------------------------------------------- generated lines
def test_healthy_mixed_lines_per_card_class(tmp_path, capsys):
    places = {bus: (i // 4, NUMA[i // 4], None) for i, bus in enumerate(HM_GPUS)}
    # NPUs 0-3 (C1, C2, 81, 82) on NUMA 1, 4-7 (01, 02, 41, 42) on NUMA 0
    places |= {bus: (1 - i // 4, NUMA[1 - i // 4], None) for i, bus in enumerate(HM_NPUS)}
    root = sysfs(tmp_path / "root", places, two_sockets())
    out, code = gres_conf(capsys, "--replay", str(NODES / "healthy-mixed"), "--root", str(root))
    assert code == 0, out
    n = "NodeName=mixed-ok-01"
    assert lines_of(out) == [
        f"{n} Name=ascend Type=910b File=/dev/davinci[0-3] Count=4 Cores=48-95",
        f"{n} Name=ascend Type=910b File=/dev/davinci[4-7] Count=4 Cores=0-47",
        f"{n} Name=gpu Type=h100 File=/dev/nvidia[0-3] Count=4 Cores=0-47",
        f"{n} Name=gpu Type=h100 File=/dev/nvidia[4-7] Count=4 Cores=48-95",
        "GresTypes=ascend,gpu",
        f"{n} Gres=ascend:910b:8,gpu:h100:8 Features=910b,h100",
    ]
    assert "AutoDetect=nvml" in out  # Slurm could find the GPUs itself
    # the TaskProlog maps Slurm's ascend index to ASCEND_RT_VISIBLE_DEVICES; nothing for
    # gpu (Slurm's gpu plugin sets CUDA_VISIBLE_DEVICES)
    assert "  --export ascend ASCEND_RT_VISIBLE_DEVICES 0=0,1=1,2=2,3=3,4=4,5=5,6=6,7=7" in out
    assert "exec /usr/libexec/hetpatrol/taskprolog" in out
    assert "CUDA_VISIBLE_DEVICES" not in out


def test_a_gres_word_or_node_name_the_files_cannot_carry_is_refused(tmp_path, capsys):
    # gres-conf writes the profile's GRES name into gres.conf, Gres= and the TaskProlog
    # every job runs: '$(...)' there ran as each job's user, a blank added gres.conf keys
    hm = str(NODES / "healthy-mixed")
    for key, value in (("gres", "ascend$(touch /tmp/x)"), ("gres_type", "910b File=/dev/sda")):
        cfg = tmp_path / f"{key}.yaml"
        cfg.write_text(f"profiles:\n  - name: ascend-910b\n    {key}: {value!r}\n")
        code = main(["gres-conf", "--config", str(cfg), "--replay", hm])
        out, err = capsys.readouterr()
        assert code == 78 and out == "", out
        assert "profiles[" in err and f".{key}: {value!r} does not match" in err, err
    for node in ("n$(id)", "n1;reboot"):
        code = main(["gres-conf", "--replay", hm, "--node", node])
        out, err = capsys.readouterr()
        assert code == 64 and out == "", out
        assert f"node name {node!r} is not one word" in err
    # a MIG type as AutoDetect names it is one word
    cfg = tmp_path / "mig.yaml"
    cfg.write_text("profiles:\n  - name: ascend-910b\n    gres_type: 910b_1g.10gb\n")
    out, code = gres_conf(capsys, "--config", str(cfg), "--replay", hm)
    assert "Name=ascend Type=910b_1g.10gb File=/dev/davinci[0-7]" in out, out


def test_nvidia_file_is_the_minor_number_and_a_lost_gpu_has_no_line(capsys):
    # sick-mixed: NVML indices 0-3 have minor numbers 3, 4, 5, 6; GPU 3 is lost
    # (GpuIsLost: no identity read, so no minor number)
    out, code = gres_conf(capsys, "--replay", str(NODES / "sick-mixed"))
    assert code == 3, out
    assert "NodeName=mixed-sick-01 Name=gpu Type=a100 File=/dev/nvidia[3-5] Count=3" in out
    assert "# nvidia/3 (gpu): no line: the nvidia plugin read no device number" in out
    # said once for the cards of both lines (the NPUs, the three GPUs with a line)
    said = out.replace("\n#   ", " ")
    assert said.count("no Cores=") == 1, out
    assert "# ascend/0-7/0, nvidia/0-2: no Cores=: the replay has no root/ tree: placement" in said


def test_ascend_a3_davinci_is_the_phy_id(capsys):
    out, code = gres_conf(capsys, "--replay", str(NODES / "ascend-a3-only"))
    assert code == 1, out  # placement not read (no root/): no Cores=, said
    # 8 Atlas A3 cards x 2 chips: Phy-ID 0..15 (NPU 0 chips 0/1 = 0/1, NPU 7 = 14/15)
    assert "NodeName=a3-01 Name=ascend Type=910_93 File=/dev/davinci[0-15] Count=16" in out
    assert "NodeName=a3-01 Gres=ascend:910_93:16 Features=910_93" in out


def test_ascend_chips_whose_phy_ids_are_not_in_order_get_a_line_each():
    plan = Plan("n1")
    for i, phy in enumerate((0, 1, 3, 2)):
        plan.cards.append(
            CardLine(f"ascend/{i}/0", "ascend", "ascend", "910b", f"/dev/davinci{phy}", phy,
                     (0, 1), visible=(("ASCEND_RT_VISIBLE_DEVICES", phy),)))  # fmt: skip
    assert [line for line, _ in plan.lines()] == [
        "NodeName=n1 Name=ascend Type=910b File=/dev/davinci[0-1] Count=2 Cores=0-1",
        "NodeName=n1 Name=ascend Type=910b File=/dev/davinci3 Count=1 Cores=0-1",
        "NodeName=n1 Name=ascend Type=910b File=/dev/davinci2 Count=1 Cores=0-1",
    ]
    # Slurm index 2 is davinci3, index 3 davinci2 (gres.conf order)
    assert "--export ascend ASCEND_RT_VISIBLE_DEVICES 0=0,1=1,2=3,3=2" in plan.task_prolog()


def test_task_prolog_numbers_several_types_type_by_type_in_the_gres_order():
    """Chips of two types alternating (davinci0 910b, davinci1 310p, davinci2 910b):
    the plan's Gres= is ascend:910b:2,ascend:310p:1 (first seen) and Slurm numbers the
    910b lines first (_merge_gres, seen for gpu types on slurmd 22.05 in
    tests/test_gres_order.py): IDX 1 is davinci2, IDX 2 davinci1. Before: 1=1, 2=2."""
    plan = Plan("n1")
    for phy, kind in enumerate(("910b", "310p", "910b")):
        plan.cards.append(
            CardLine(f"ascend/{phy}/0", "ascend", "ascend", kind, f"/dev/davinci{phy}", phy,
                     (0, 1), visible=(("ASCEND_RT_VISIBLE_DEVICES", phy),)))  # fmt: skip
    assert plan.slurm_conf()[1] == "NodeName=n1 Gres=ascend:910b:2,ascend:310p:1 Features=910b,310p"
    assert "--export ascend ASCEND_RT_VISIBLE_DEVICES 0=0,1=2,2=1" in plan.task_prolog()
    # slurmctld registered the types the other way round: --check says the table is off
    line = "NodeName=n1 Gres=ascend:310p:1,ascend:910b:2 State=IDLE"
    assert [d.message for d in check_registration(plan, line)] == [
        "ascend: slurmctld's Gres= has the types in the order 310p, 910b, the TaskProlog "
        "numbers them 910b, 310p: Slurm numbers a job's IDX type by type in Gres= order "
        "(_merge_gres)"
    ]
    assert (
        check_registration(plan, line.replace("310p:1,ascend:910b:2", "910b:2,ascend:310p:1")) == []
    )


def test_hygon_without_a_bus_id_has_no_line_and_says_why(tmp_path, capsys):
    scenario = NODES / "mixed-three-vendor"
    root = sysfs(tmp_path / "root", {}, two_sockets())
    out, code = gres_conf(
        capsys, "--replay", str(scenario), "--config", str(scenario / "hetpatrol.yaml"),
        "--root", str(root),
    )  # fmt: skip
    assert code == 3
    # the recorded rocm-smi query has no --showbus: the DCU's render node is unknown, the
    # same for its 8 DCUs (rocm-smi cards 0-7): said once for them all
    said = [ln for ln in out.splitlines() if ln.startswith("# hygon/")]
    assert said == ["# hygon/0-7 (dcu:k100_ai, 8 cards): no line: no bus id read: its DRM render"]
    assert "#   node is unknown" in out.splitlines()


def test_gres_conf_comments_fit_79_columns_broken_at_spaces(capsys):
    """A tmux pane or terminal of 80 columns broke a longer comment mid-word (``...
    slurmd is buil`` / ``t with it``) into a line that was no comment. Each comment now
    fits 79 columns, broken at a space, every line of it starting with ``#``, and its
    words are all there (the AutoDetect note of the nvidia plugin, the vNPU note)."""
    out, code = gres_conf(capsys, "--replay", str(NODES / "healthy-mixed"))
    assert code == 1, out  # placement not read: no Cores=
    lines = out.split("\n\n")[0].splitlines()  # the gres.conf part
    assert all(len(ln) <= 79 for ln in lines if ln.startswith("#")), out
    assert [ln for ln in lines if not ln.startswith("#")] == [
        "NodeName=mixed-ok-01 Name=ascend Type=910b File=/dev/davinci[0-7] Count=8",
        "NodeName=mixed-ok-01 Name=gpu Type=h100 File=/dev/nvidia[0-7] Count=8",
    ]
    at = lines.index("# gpu: Slurm finds nvidia cards itself with AutoDetect=nvml (when slurmd is")
    assert lines[at + 1] == "#   built with it); these lines need no such build"
    # mig-a100's four MIG devices have one reason for no Cores=: said once, for the four
    out, code = gres_conf(capsys, "--replay", str(NODES / "mig-a100"))
    said = [ln for ln in out.splitlines() if "no Cores=" in ln]
    assert said == ["# nvidia/0/mig0-3: no Cores=:"], out
    # a word longer than a line stays whole, on a line of its own; never an empty comment
    long = "/sys/bus/pci/devices/" + "x" * 90
    assert comment(f"a path {long} is long") == ["# a path", f"#   {long}", "#   is long"]
    assert comment("") == ["#"]


# ---------------------------------------------------------------------- --check
INSTALLED = """\
# a site's gres.conf
NodeName=mixed-ok-01 Name=gpu Type=a100 File=/dev/nvidia[0-3] Cores=0-47
NodeName=mixed-ok-01 Name=gpu Type=h100 File=/dev/nvidia[4-8] Count=4 Cores=48-95
NodeName=other[01-04] Name=gpu Type=h100 File=/dev/nvidia[0-7]
NodeName=mixed-ok-01 Name=ascend Type=910b File=/dev/davinci[0-7] Cores=0-47
"""


def healthy_plan(tmp_path) -> Plan:
    places = {bus: (i // 4, NUMA[i // 4], None) for i, bus in enumerate(HM_GPUS)}
    places |= {bus: (1 - i // 4, NUMA[1 - i // 4], None) for i, bus in enumerate(HM_NPUS)}
    root = sysfs(tmp_path / "root", places, two_sockets())
    config = load_config(None)
    patroller = Patroller(config, replay_dir=NODES / "healthy-mixed")
    try:
        report = patroller.run()
    finally:
        patroller.close()
    return build_plan(report.cards, config, "mixed-ok-01", root)


def test_check_says_each_difference_with_its_fix(tmp_path):
    plan = healthy_plan(tmp_path)
    diffs = check_gres_conf(plan, INSTALLED, "gres.conf")
    got = [(d.where, d.message, d.fix) for d in diffs]
    fix_gpu0 = "NodeName=mixed-ok-01 Name=gpu Type=h100 File=/dev/nvidia[0-3] Count=4 Cores=0-47"
    fix_npu0 = (
        "NodeName=mixed-ok-01 Name=ascend Type=910b File=/dev/davinci[0-3] Count=4 Cores=48-95"  # noqa: E501
    )
    count = "Count=4 but 5 files (gres.conf(5): with File=, Count must be the number of files)"
    assert ("gres.conf:3", count, "drop Count= or make it the number of files") in got
    assert ("gres.conf:2", "/dev/nvidia0 is under gpu:a100; the card (nvidia/0) is gpu:h100",
            fix_gpu0) in got  # fmt: skip
    # NPUs 0-3 sit on NUMA 1 (cores 48-95), the file says 0-47
    assert ("gres.conf:5", "/dev/davinci0: Cores=0-47, but the card's NUMA node has cores "
            "48-95", fix_npu0) in got  # fmt: skip
    assert ("gres.conf:3", "/dev/nvidia8: no card of this node has this device file",
            "remove /dev/nvidia8 from line 3") in got  # fmt: skip
    # the other nodes' line is not this node's business; nvidia4-7 and davinci4-7 agree
    assert not [d for d in diffs if "other" in d.where or "nvidia5" in d.message]
    assert not [d for d in diffs if "davinci5" in d.message]
    # a file no line names
    diffs = check_gres_conf(plan, INSTALLED.replace("davinci[0-7]", "davinci[0-6]"), "g")
    assert [d.message for d in diffs if "davinci7" in d.message] == [
        "ascend/7/0 (ascend:910b): /dev/davinci7 is in no line"
    ]


def test_check_of_slurmctlds_view(tmp_path):
    plan = healthy_plan(tmp_path)
    # scontrol show node -o (22.05 field layout, as in tests/test_slurm_gres.py recordings)
    line = (
        "NodeName=mixed-ok-01 Arch=x86_64 CoresPerSocket=48 CPUAlloc=0 CPUTot=192 "
        "Gres=gpu:a100:8(S:0-1),ascend:910b:8,mps:800 NodeAddr=10.0.0.1 "
        "State=IDLE+DRAIN Reason=gres/gpu count reported lower than configured (0 < 8) "
        "[slurm@2026-11-30T10:00:00]"
    )
    fix = "NodeName=mixed-ok-01 Gres=ascend:910b:8,gpu:h100:8 Features=910b,h100"
    diffs = check_registration(plan, line)
    why = " (Reason: gres/gpu count reported lower than configured (0 < 8))"
    assert [(d.message, d.fix) for d in diffs] == [
        (f"gpu:a100: slurmctld has 8, the node's cards are 0{why}", fix),
        (f"gpu:h100: slurmctld has 0, the node's cards are 8{why}", fix),
    ]
    good = line.replace("gpu:a100:8(S:0-1)", "gpu:H100:8(S:0-1)")
    assert check_registration(plan, good) == []
    assert [d.message for d in check_registration(plan, "NodeName=x State=IDLE")] == [
        "no node named 'mixed-ok-01'"
    ]


def test_check_command_exit_codes(tmp_path, capsys):
    conf = tmp_path / "gres.conf"
    conf.write_text(INSTALLED)
    scontrol = tmp_path / "scontrol"
    scontrol.write_text("#!/bin/sh\necho 'slurm_load_node error: Unable to contact' >&2\nexit 1\n")
    scontrol.chmod(0o755)
    cfg = tmp_path / "hetpatrol.yaml"
    cfg.write_text(f"slurm:\n  scontrol: [{scontrol}]\n")
    out, code = gres_conf(
        capsys, "--replay", str(NODES / "healthy-mixed"), "--config", str(cfg),
        "--check", "--gres-conf", str(conf),
    )  # fmt: skip
    assert code == 3, out  # slurmctld could not be asked: a source unreadable
    assert "unknown: scontrol show node mixed-ok-01: " in out
    assert "Unable to contact" in out
    assert "warning gres.conf" not in out and f"warning {conf}:2: /dev/nvidia0 is under" in out


# ------------------------------------------------------------ the real slurmd -G
def other_vendor_cards():
    """One patrol of the six plugins without a node scenario, fed their recordings."""
    other = samples_dir("other-vendors")
    feeds = {
        "amd": {
            ("amd-smi", "static", "--json"): "amd-smi-static-MI300A-cpu-and-gpu0.txt",
            ("amd-smi", "metric", "--json"): "amd-smi-metric-power-json.txt",
        },
        "cambricon": {("cnmon",): "cambricon-cnmon-v5.10.13-MLU370-X8-2cards.txt"},
        "enflame": {("efsmi",): "enflame-efsmi-v1.2.0-S60-2cards.txt"},
        "gaudi": {
            ("hl-smi", "-Q", ",".join(HL_FIELDS), "--format", "csv,noheader"): (
                "habana-hl-smi-csv-HL-325L.txt"
            )
        },
        "iluvatar": {("ixsmi",): "iluvatar-ixsmi-IX-ML-3.1.1-BI-V100.txt"},
        "kunlunxin": {("xpu_smi",): "kunlunxin-xpu_smi-R300-2cards.txt"},
    }
    names = ", ".join(f"{k}: {{}}" for k in feeds)
    config = load_config(text=f"node: n1\nlisten: null\ncollectors: {{{names}}}\n")
    patroller = Patroller(config)
    for name, outs in feeds.items():

        def run(argv, timeout, outs=outs):
            if tuple(argv) not in outs:
                raise FileNotFoundError(argv[0])
            text = (other / outs[tuple(argv)]).read_text(encoding="utf-8")
            return ToolOutput(tuple(argv), text, "", 0, False, 0.01)

        patroller._collectors[name].collector.runner = run
    try:
        report = patroller.run()
    finally:
        patroller.close()
    return config, report.cards


def scenario_cards(name: str, config_file: str | None = None):
    config = load_config(NODES / name / config_file if config_file else None)
    patroller = Patroller(config, replay_dir=NODES / name)
    try:
        return config, patroller.run().cards
    finally:
        patroller.close()


def host_sysfs(root: Path, buses: list[str]) -> Path:
    """This host's own CPU topology (slurmd checks Cores= against it), every card on
    NUMA node 0 with all online CPUs, a DRM render node per card (renderD128...)."""
    online = Path("/sys/devices/system/cpu/online").read_text().strip()
    cpus = {}
    for cpu in parse_cpulist(online):
        t = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        cpus[cpu] = (
            int((t / "physical_package_id").read_text()),
            int((t / "core_id").read_text()),
        )
    places = {bus: (0, online, 128 + i) for i, bus in enumerate(dict.fromkeys(buses))}
    return sysfs(root, places, cpus)


def slurmd_g(tmp: Path, plan: Plan, node: str, break_one: bool = False):
    """Write the plan's gres.conf (device paths under ``tmp/dev``, made as character
    devices) and slurm.conf fragment, run ``slurmd -G``; (lines, its output)."""
    dev = tmp / "dev"
    gres_lines = [line.replace("File=/dev/", f"File={dev}/") for line, _ in plan.lines()]
    # the whole gres.conf gres-conf prints, its wrapped comments too (slurmd's parser
    # must take every line of it)
    text = gres_conf_text(plan)[0]
    for line, _ in plan.lines():
        text = text.replace(f"{line}\n", line.replace("File=/dev/", f"File={dev}/") + "\n")
    for card in plan.placed:
        path = dev / card.file.removeprefix("/dev/")
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            os.mknod(path, 0o600 | 0o020000, os.makedev(240, card.number))  # S_IFCHR
    if break_one:  # a gpu device file that is a plain file: slurmd must refuse it
        victim = next(c for c in plan.placed if c.name == "gpu")
        path = dev / victim.file.removeprefix("/dev/")
        path.unlink()
        path.write_text("")
    types, node_line = plan.slurm_conf()
    (tmp / "gres.conf").write_text(text)
    host = subprocess.run(["hostname", "-s"], capture_output=True, text=True).stdout.strip()
    (tmp / "spool").mkdir(exist_ok=True)
    (tmp / "slurm.conf").write_text(
        f"ClusterName=gresconf\nSlurmctldHost={host}(127.0.0.1)\n{types}\n"
        f"SlurmdSpoolDir={tmp}/spool\nSlurmdPidFile={tmp}/slurmd.pid\n"
        f"SlurmdLogFile={tmp}/slurmd.log\nProctrackType=proctrack/linuxproc\n"
        "TaskPlugin=task/none\nSelectType=select/cons_tres\n"
        f"{node_line.replace(f'NodeName={node}', f'NodeName={node} NodeHostname={host}')} "
        f"CPUs={os.cpu_count()}\nPartitionName=p Nodes={node}\n"
    )
    done = subprocess.run(
        ["slurmd", "-G", "-N", node, "-f", str(tmp / "slurm.conf")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return gres_lines, done.stdout + done.stderr


def registered(output: str) -> list[str]:
    """slurmd -G's ``Gres Name=... Count=... File=... Cores=...`` lines, without Index,
    ID and CoreCnt (the ID is a hash of the name; Index is not the device index)."""
    out = []
    for line in output.splitlines():
        if "Gres Name=" not in line:
            continue
        keep = [t for t in line.split("Gres ", 1)[1].split() if t.split("=")[0] in
                ("Name", "Type", "Count", "File", "Cores")]  # fmt: skip
        out.append(" ".join(keep))
    return out


def _need_slurmd():
    if shutil.which("slurmd") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("slurmd is not installed (Debian: slurmd)")
        pytest.skip("slurmd is not installed (Debian: slurmd)")
    if os.geteuid() != 0:  # mknod of the stand-in device nodes
        if os.environ.get("CI") == "true":
            pytest.fail("slurmd -G test needs root (mknod)")
        pytest.skip("needs root (mknod of the stand-in device nodes)")


CASES = {
    "healthy-mixed": lambda: scenario_cards("healthy-mixed"),
    "ascend-a3-only": lambda: scenario_cards("ascend-a3-only"),
    "mixed-three-vendor": lambda: scenario_cards("mixed-three-vendor", "hetpatrol.yaml"),
    "other-vendors": other_vendor_cards,
}


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.parametrize("case", sorted(CASES))
def test_real_slurmd_accepts_the_lines_for_every_vendor(case, tmp_path):
    _need_slurmd()
    config, cards = CASES[case]()
    if case == "mixed-three-vendor":
        # the recorded rocm-smi query has no --showbus; the DCUs get bus ids here so that
        # their render nodes can be placed (the lines are what slurmd is asked about)
        for i, card in enumerate(c for c in cards if c.vendor == "hygon"):
            card.bus_id = f"0000:{0x30 + i:02x}:00.0"
    root = host_sysfs(tmp_path / "root", [c.bus_id for c in cards if c.bus_id])
    node = "hp-gres01"
    plan = build_plan(cards, config, node, root)
    vendors = {c.vendor for c in plan.placed}
    assert vendors == {c.vendor for c in cards}, render(plan)[0]  # every vendor has lines
    lines, output = slurmd_g(tmp_path, plan, node)
    assert "error" not in output.lower(), f"{output}\n" + "\n".join(lines)
    if case == "healthy-mixed":  # a comment wrapped onto a second '#' line was taken
        assert "\n#   built with it); " in (tmp_path / "gres.conf").read_text()
    # slurmd registers each line as written: Name, Type, Count, File, Cores
    want = []
    for line, _cards in plan.lines():
        fields = dict(t.split("=", 1) for t in line.split()[1:])
        path = fields["File"].replace("/dev/", f"{tmp_path}/dev/")
        cores = f" Cores={fields['Cores']}" if "Cores" in fields else ""
        typ = f" Type={fields['Type']}" if "Type" in fields else ""
        want.append(f"Name={fields['Name']}{typ} Count={fields['Count']} File={path}{cores}")
    assert sorted(registered(output)) == sorted(want), output  # slurmd groups by name


@pytest.mark.slow
@pytest.mark.slurm
def test_real_slurmd_refuses_a_gpu_file_that_is_no_device(tmp_path):
    """The break: a plain file where a gpu line's File= points (Slurm's stat() check)."""
    _need_slurmd()
    config, cards = scenario_cards("healthy-mixed")
    root = host_sysfs(tmp_path / "root", [c.bus_id for c in cards if c.bus_id])
    plan = build_plan(cards, config, "hp-gres01", root)
    _lines, output = slurmd_g(tmp_path, plan, "hp-gres01", break_one=True)
    assert "nvidia0 is not a valid character or block device, fix your gres.conf" in output


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


# ------------------------------------------------------- the TaskProlog, for real
def _task_prolog_cluster(run: str | None = None, overrides: dict[str, str] | None = None):
    """A real cluster (tests/slurm_cluster.py: 8 ascend:910b devices on the node) whose
    TaskProlog= is the script gres-conf writes for 8 ascend cards (index i -> id 10+i,
    so that the table, not the index, shows), its program the packaged wrapper
    (packaging/slurm/taskprolog) running this checkout's hetpatrol (or ``run``);
    ``overrides``: more slurm.conf keys."""
    from slurm_cluster import BINARIES, NODE_NAME, start_cluster

    missing = [b for b in (*BINARIES, "srun", "squeue") if shutil.which(b) is None]
    if missing or os.geteuid() != 0:
        why = f"not installed: {missing}" if missing else "needs root (SlurmUser=root)"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    plan = plan8(NODE_NAME)
    wrapper = (REPO / "packaging" / "slurm" / "taskprolog").read_text()
    assert "\nhetpatrol task-prolog " in wrapper
    cluster = start_cluster(overrides={"TaskProlog": "{root}/taskprolog", **(overrides or {})})
    program = cluster.root / "hetpatrol-taskprolog"
    program.write_text(
        wrapper.replace(
            "\nhetpatrol task-prolog ",
            f"\n{run or f'{sys.executable} -m hetpatrol.entry task-prolog'} ",
        )
    )
    program.chmod(0o755)
    script = cluster.root / "taskprolog"
    script.write_text(plan.task_prolog(str(program)))
    script.chmod(0o755)
    return cluster


def _job_output(cluster, name: str, *sbatch: str, timeout: float = 60) -> str:
    """Submit one job (``sbatch`` options and ``--wrap``), wait for its output."""
    out = cluster.root / f"{name}.out"
    cluster.run("sbatch", "-N1", "-o", str(out), *sbatch)
    deadline = time.monotonic() + timeout
    while not (out.exists() and "A=" in out.read_text()):
        assert time.monotonic() < deadline, f"job {name} never wrote its output"
        time.sleep(0.2)
    return out.read_text()


@pytest.mark.slow
@pytest.mark.slurm
def test_task_prolog_sets_the_vendor_variable_from_the_jobs_gres_indices(tmp_path):
    """The generated TaskProlog on the real slurmd: a job's ascend indices become
    ASCEND_RT_VISIBLE_DEVICES through the plan's table, and Slurm itself sets no device
    variable for this GRES. (A job started while another holds devices would get later
    indices; on this 2-CPU node a second job waits for the first, so one job is shown.)
    The job's environment names a PYTHONHOME that is no Python's (every Python fails to
    start with it): the wrapper drops the user's Python settings."""
    cluster = _task_prolog_cluster()
    try:
        with cluster.explain():
            wrap = 'echo "A=$ASCEND_RT_VISIBLE_DEVICES G=${SLURM_JOB_GPUS-unset}"'
            home = f"--export=ALL,PYTHONHOME={tmp_path}"
            text = _job_output(cluster, "job", "--gres=ascend:910b:3", home, "--wrap", wrap)
            # IDX 0-2 -> the table's 10, 11, 12; Slurm sets no SLURM_JOB_GPUS for ascend
            assert text.strip() == "A=10,11,12 G=unset"
    finally:
        cluster.stop()
        shutil.rmtree(cluster.root, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.slurm
def test_task_prolog_takes_no_gres_line_from_a_job_name_or_comment(tmp_path):
    """The real slurmctld prints a job name and comment raw, newlines too: a job name
    holding '     Nodes=<node> ... GRES=ascend:910b:8(IDX:4-7)' made a TaskProlog that
    read every ``Nodes=`` line of ``scontrol show job -d`` export the cards of other jobs
    (A=14,15,16,17,10 for a job holding IDX 0). On this Slurm 22.05 hetpatrol
    task-prolog reads ``scontrol -d show job`` (one job; 22.05's squeue --json lists the
    whole queue) and takes only Slurm's own per-node block, each line of its exact shape:
    each job gets its own IDX 0 (-> 10) whatever its name, comment or both say with a
    forged detail line and NumNodes=/MinCPUsNode= lines. The one forgery the 22.05 text
    cannot tell apart is an exact copy of Slurm's whole block (here in the comment, with
    IDX:4-7): the blocks differ, so no variable is set and the job's output says why;
    the forged 14-17 is never exported (from 23.02.3 the one-job squeue --json tells)."""
    from slurm_cluster import NODE_NAME

    fake = f"     Nodes={NODE_NAME} CPU_IDs=0 Mem=0 GRES=ascend:910b:8(IDX:4-7)"
    forged = f"c\nNumNodes=1\n{fake}\nMinCPUsNode=1"
    copy = (
        "c\n   NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:*\n"
        "   TRES=cpu=1,mem=1M,node=1,billing=1\n"
        "   Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=*\n   JOB_GRES=ascend:910b:4\n"
        f"     Nodes={NODE_NAME} CPU_IDs=0 Mem=1 GRES=ascend:910b:4(IDX:4-7)\n"
        "   MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0\n   x"
    )
    cluster = _task_prolog_cluster()
    try:
        with cluster.explain():
            for n, text in enumerate(
                (["-J", f"x\n{fake}"], ["--comment", forged], ["-J", forged, "--comment", forged])
            ):
                # one after the other: each job alone on the node holds IDX 0
                wrap = 'echo "A=${ASCEND_RT_VISIBLE_DEVICES-unset}"'
                out = _job_output(cluster, f"job{n}", "--gres=ascend:910b:1", *text, "--wrap", wrap)
                assert out.splitlines() == ["A=10"], (n, out)
            out = _job_output(cluster, "copy", "--gres=ascend:910b:1", "--comment", copy, "--wrap",
                              'echo "A=${ASCEND_RT_VISIBLE_DEVICES-unset}"')  # fmt: skip
            said, value = out.splitlines()
            assert value == "A=unset", out
            assert said.startswith("hetpatrol TaskProlog: scontrol show job -d: 2 per-node"), out
            assert said.endswith("differ for hp-gpu01 (a job name or comment copying Slurm's "
                                 "lines?): no device variable set"), out  # fmt: skip
    finally:
        cluster.stop()
        shutil.rmtree(cluster.root, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.slurm
def test_a_task_launch_asks_slurmctld_for_its_one_job_only(tmp_path):
    """slurmctld at debug2 logs each RPC it processes: the tasks of a job (the batch
    script and one srun step, each running the TaskProlog) issue REQUEST_JOB_INFO_SINGLE
    (slurm_load_job, one job) and never REQUEST_JOB_INFO (slurm_load_jobs: the whole
    queue, what squeue --json asks on 22.05 whatever --jobs= says). Measured with 300
    more jobs queued (docs/slurm.md): 1259 bytes per task instead of 0.93 MB."""
    cluster = _task_prolog_cluster(overrides={"SlurmctldDebug": "debug2"})
    log = cluster.root / "log" / "slurmctld.log"
    try:
        with cluster.explain():
            seen = len(log.read_text())
            wrap = 'srun -n1 true; echo "A=${ASCEND_RT_VISIBLE_DEVICES-unset}"'
            out = _job_output(cluster, "job", "--gres=ascend:910b:2", "--wrap", wrap)
            # srun may add its own notes on a loaded machine ("srun: Job step creation
            # temporarily disabled, retrying"): the variable's line and no refusal of ours
            lines = out.splitlines()
            assert "A=10,11" in lines, out
            assert not [x for x in lines if x.startswith("hetpatrol")], out
            rpcs = log.read_text()[seen:]
            assert "Processing RPC: REQUEST_JOB_INFO from" not in rpcs, rpcs[-3000:]
            assert rpcs.count("Processing RPC: REQUEST_JOB_INFO_SINGLE from") >= 2, rpcs[-3000:]
    finally:
        cluster.stop()
        shutil.rmtree(cluster.root, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.slurm
def test_a_task_prolog_that_fails_would_fail_the_job_so_ours_never_does(tmp_path):
    """slurmd 22.05 fails the job when its TaskProlog exits non-zero ("TaskProlog failed
    status=1", JobState=FAILED); the packaged wrapper turns a hetpatrol that cannot run
    (here: one that exits 1) into one line of the job's output, and the job runs."""
    cluster = _task_prolog_cluster(run="false")
    try:
        with cluster.explain():
            out = _job_output(cluster, "ok", "--gres=ascend:910b:1", "--wrap",
                              'echo "A=${ASCEND_RT_VISIBLE_DEVICES-unset}"')  # fmt: skip
            assert out.splitlines() == [
                "hetpatrol TaskProlog: hetpatrol task-prolog exited 1: no device variable set",
                "A=unset",
            ]
            # the same job with a TaskProlog that exits 1 itself
            script = cluster.root / "taskprolog"
            script.write_text("#!/bin/sh\nexit 1\n")
            failed = cluster.root / "failed.out"
            job = cluster.run("sbatch", "--parsable", "-o", str(failed), "--wrap", "echo A=ran")
            job_id = job.stdout.strip().split(";")[0]
            deadline = time.monotonic() + 60
            while "JobState=FAILED" not in (shown := cluster.scontrol("show", "job", job_id)):
                assert "JobState=COMPLETED" not in shown, shown
                assert time.monotonic() < deadline, shown
                time.sleep(0.2)
            assert "TaskProlog failed status=1" in failed.read_text()
            assert "A=ran" not in failed.read_text()
    finally:
        cluster.stop()
        shutil.rmtree(cluster.root, ignore_errors=True)


# ----------------------------------------------- --check against the real slurmctld
slurm_cluster = _cluster.slurm_cluster  # the session's real cluster (tests/slurm_cluster.py)


@pytest.mark.slow
@pytest.mark.slurm
def test_check_against_the_real_slurmctld(slurm_cluster, tmp_path, capsys):
    """tests/slurm_cluster.py registers hp-gpu01 as gpu:a100:8,ascend:910b:8. A replay of
    8 A100s + 8 910B4s agrees with it; one of 6 A100s is told the difference and its fix.
    The gres.conf checked is the one gres-conf writes (so only slurmctld differs)."""
    cfg = tmp_path / "hetpatrol.yaml"
    argv = ", ".join(f'"{a}"' for a in slurm_cluster.scontrol_argv)
    cfg.write_text(f"slurm:\n  node_name: {slurm_cluster.node}\n  scontrol: [{argv}]\n")
    for gpus, want_code in ((8, 0), (6, 1)):
        replay = _cluster.make_replay(tmp_path / f"a100x{gpus}", gpus)
        out, code = gres_conf(capsys, "--replay", str(replay), "--config", str(cfg))
        conf = tmp_path / f"gres{gpus}.conf"
        conf.write_text("\n".join(lines_of(out)[:-2]) + "\n")
        out, code = gres_conf(
            capsys, "--replay", str(replay), "--config", str(cfg), "--check",
            "--gres-conf", str(conf),
        )  # fmt: skip
        with slurm_cluster.explain():
            assert code == want_code, out
        if gpus == 8:
            assert out == "ok: gres.conf and slurmctld agree with the node's cards\n"
        else:
            assert out == (
                "warning slurmctld: gpu:a100: slurmctld has 8, the node's cards are 6\n"
                f"    fix: NodeName={slurm_cluster.node} Gres=ascend:910b:8,gpu:a100:6 "
                "Features=910b,a100\n"
            )


def test_no_card_read_writes_no_empty_gres_line():
    """npu-smi fails (DCMI -8005): no card was read, so there is no line to write; an
    empty ``Gres=`` would tell Slurm the node has none."""
    import subprocess

    from conftest import HETPATROL, NODES

    res = subprocess.run(
        [*HETPATROL, "gres-conf", "--replay", str(NODES / "ascend-dcmi-error")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 3, res.stdout + res.stderr
    assert res.stdout == ""
    assert "no card was read on" in res.stderr and "ascend failed" in res.stderr
