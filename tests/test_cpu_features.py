"""The OS readers backend probes share."""

from __future__ import annotations

import platform
import sys

import pytest

from eemicrogpt_core.backends import cpu_features


def test_machine_is_lower_case_platform_machine() -> None:
    assert cpu_features.machine() == platform.machine().lower()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="getauxval is Linux's")
def test_auxval_reads_the_real_hwcap_unsigned() -> None:
    hwcap = cpu_features.linux_auxval(cpu_features.AT_HWCAP)
    assert hwcap > 0  # every Linux CPU reports some feature bits (x86: CPUID.1:EDX; arm64: FP/ASIMD)
    assert cpu_features.linux_auxval(cpu_features.AT_HWCAP2) >= 0  # unsigned: never a truncated negative
    assert cpu_features.linux_auxval(12345) == 0  # unknown kinds read as 0, as getauxval documents
