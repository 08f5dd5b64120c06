"""The hooks of device runs (tests/helpers/device_runs.py): on a machine that must have a device, a test that skips for
it fails; under GGMLPY_VK_VALIDATION, a message in any process's validation log fails the session."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests.helpers import ROOT


SKIPPING = textwrap.dedent('''
    import pytest

    @pytest.mark.parametrize("device", ["CPU", "CUDA0"])
    def test_on(device):
        if device == "CUDA0":
            pytest.skip("no CUDA0 device (an NVIDIA GPU and its driver)")

    def test_other():
        pytest.skip("needs scipy")

    def test_without_the_device():
        pytest.skip("CUDA0 is present on this machine")
''')


def _pytest(tmp_path, env: dict) -> subprocess.CompletedProcess:
    (tmp_path / "test_case.py").write_text(SKIPPING)
    (tmp_path / "conftest.py").write_text("from tests.helpers.device_runs import pytest_runtest_makereport, "
                                          "pytest_sessionfinish  # noqa: F401\n")
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfs", str(tmp_path)],
                          cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT), **env), capture_output=True,
                          text=True, timeout=120)


def test_a_skip_for_a_required_device_fails_and_other_skips_stay(tmp_path):
    env = {"GGMLPY_REQUIRE_DEVICES": "", "GGMLPY_VK_VALIDATION": ""}
    plain = _pytest(tmp_path, env)
    assert plain.returncode == 0 and "1 passed, 3 skipped" in plain.stdout, plain.stdout
    required = _pytest(tmp_path, dict(env, GGMLPY_REQUIRE_DEVICES="CUDA0"))
    assert required.returncode == 1, required.stdout
    assert "1 failed, 1 passed, 2 skipped" in required.stdout, required.stdout
    assert "must have CUDA0" in required.stdout and "test_on[CUDA0]" in required.stdout


def test_a_validation_message_in_any_log_fails_the_session(tmp_path):
    logs = tmp_path / "vvl"
    logs.mkdir()
    (logs / "vvl-11.log").write_text("")
    clean = _pytest(tmp_path, {"GGMLPY_VK_VALIDATION": str(logs), "GGMLPY_REQUIRE_DEVICES": ""})
    assert clean.returncode == 0, clean.stdout
    (logs / "vvl-12.log").write_text("VUID-VkWriteDescriptorSet-descriptorType-00328(ERROR / SPEC): msgNum: 1 - "
                                     "Validation Error: offset (0xc) must be a multiple of 0x10\n")
    dirty = _pytest(tmp_path, {"GGMLPY_VK_VALIDATION": str(logs), "GGMLPY_REQUIRE_DEVICES": ""})
    assert dirty.returncode == 1, dirty.stdout
    assert "1 x VUID-VkWriteDescriptorSet-descriptorType-00328" in dirty.stdout and "vvl-12.log" in dirty.stdout
