"""pipeline.accel's reading of the CPU: the one place that says which flags a CPU has (native bf16 for the
precision checks, the speed flags every benchmark records), from a /proc/cpuinfo of each kind."""

import pytest

from pipeline import accel

XEON = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
flags\t\t: fpu sse2 avx2 avx512f avx512_vnni avx512_bf16 amx_bf16 amx_int8
processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
flags\t\t: fpu sse2 avx2 avx512f avx512_vnni avx512_bf16 amx_bf16 amx_int8
"""
AVX2_ONLY = "processor\t: 0\nmodel name\t: AMD EPYC 7B12\nflags\t\t: fpu sse2 avx2 fma\n"
ARM = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\nCPU implementer\t: 0x41\n"
# a "bf16" elsewhere than the flags (a model name, a bug list) is no flag
DECOY = "processor\t: 0\nmodel name\t: not bf16 avx512_bf16\nflags\t\t: fpu sse2 avx2\n"


@pytest.mark.parametrize("text, native, listed", [
    (XEON, True, "avx2 avx512f avx512_bf16 amx_bf16 avx512_vnni amx_int8"),
    (AVX2_ONLY, False, "avx2"),
    (ARM, True, "none of avx2/avx512f/avx512_bf16/amx_bf16/avx512_vnni/amx_int8"),
    (DECOY, False, "avx2"),
])
def test_the_flags_come_from_the_flags_lines_only(tmp_path, monkeypatch, text, native, listed):
    monkeypatch.delenv(accel.NATIVE_BF16_VAR)  # the suite's pin (tests/conftest.py), lifted: the flags decide
    (tmp_path / "cpuinfo").write_text(text)
    monkeypatch.setattr(accel, "CPUINFO", tmp_path / "cpuinfo")
    assert accel.cpu_has_native_bf16() is native
    assert accel.describe_cpu().split(", CPU flags ")[1] == listed


def test_an_unreadable_cpuinfo_is_no_flags_and_still_a_description(tmp_path, monkeypatch):
    monkeypatch.delenv(accel.NATIVE_BF16_VAR)
    monkeypatch.setattr(accel, "CPUINFO", tmp_path / "absent")
    assert accel.cpu_flags() == set() and not accel.cpu_has_native_bf16()
    assert ", CPU flags none of avx2/" in accel.describe_cpu()


def test_the_model_name_is_the_first_processors(tmp_path, monkeypatch):
    (tmp_path / "cpuinfo").write_text(XEON)
    monkeypatch.setattr(accel, "CPUINFO", tmp_path / "cpuinfo")
    assert accel.describe_cpu().startswith("Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz, ")


def test_the_detector_can_be_told_and_a_bad_value_is_one_line(tmp_path, monkeypatch):
    """$PIPELINE_NATIVE_BF16 answers instead of the flags, both ways; `auto` says which of the two decided."""
    (tmp_path / "cpuinfo").write_text(XEON)
    monkeypatch.setattr(accel, "CPUINFO", tmp_path / "cpuinfo")
    monkeypatch.setenv(accel.NATIVE_BF16_VAR, "0")
    assert not accel.cpu_has_native_bf16() and not accel.native_bf16("cpu")
    assert accel.why_precision("cpu") == "$PIPELINE_NATIVE_BF16=0"
    monkeypatch.delenv(accel.NATIVE_BF16_VAR)
    assert accel.native_bf16("cpu") and accel.why_precision("cpu") == "CPU flags amx_bf16 avx512_bf16"
    (tmp_path / "cpuinfo").write_text(AVX2_ONLY)
    monkeypatch.setenv(accel.NATIVE_BF16_VAR, "1")
    assert accel.native_bf16("cpu") and accel.why_precision("cpu") == "$PIPELINE_NATIVE_BF16=1"
    monkeypatch.delenv(accel.NATIVE_BF16_VAR)
    assert accel.why_precision("cpu") == "this CPU has no native bf16 (no avx512_bf16/amx_bf16)"
    monkeypatch.setenv(accel.NATIVE_BF16_VAR, "yes")
    with pytest.raises(ValueError, match=r"^\$PIPELINE_NATIVE_BF16='yes': set it to 1 or 0, or unset it"):
        accel.cpu_has_native_bf16()
    assert not accel.native_bf16("mps")
