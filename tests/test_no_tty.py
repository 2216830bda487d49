"""Without a terminal of its own the command has no controlling terminal:
opening /dev/tty fails at once (ENXIO), even when corral itself runs on a
terminal, so nothing waits for input from a terminal that is not there."""

import shlex
import shutil
import subprocess

import pytest

from conftest import CORRAL, marker_env
from modes import all_modes, mode_flags

#: Opens /dev/tty and says what happened.
PROBE = (
    "import errno, os\n"
    "try:\n"
    "    os.open('/dev/tty', os.O_RDWR)\n"
    "    print('opened')\n"
    "except OSError as e:\n"
    "    print(errno.errorcode[e.errno])\n"
)


@pytest.mark.parametrize("mode", all_modes())
def test_dev_tty_cannot_be_opened_even_when_corral_has_a_terminal(mode, marker, tmp_path):
    if shutil.which("script") is None:
        pytest.skip("script(1) (util-linux) gives corral a terminal")
    record = tmp_path / "r.json"
    inner = shlex.join([*CORRAL, "--quiet", "--json", str(record), *mode_flags(mode), "--", "python3", "-c", PROBE])
    # Does corral itself have the terminal? The same probe, before it.
    outer = f"python3 -c {shlex.quote(PROBE)}; {inner}"
    out = subprocess.run(
        ["script", "-qec", outer, "/dev/null"],
        env=marker_env(marker),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    lines = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    assert lines[:1] == ["opened"], out  # corral ran on a terminal
    assert lines[1:] == ["ENXIO"], out  # its command has none
    assert record.exists()
