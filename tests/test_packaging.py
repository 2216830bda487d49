"""The Debian package (packaging/build-deb) and the shell completions.

The slow test builds the .deb (45-90 s: pip fetches the dependencies from
PyPI) -- or reuses the one named by $CORRAL_DEB -- installs it on this
machine with ``dpkg -i``, runs the installed ``corral`` and ``corralctl``, and removes it with
``dpkg -r`` at the end (unless corral-systemd was installed before the test
started: then it is left installed, upgraded to this build).

Without root or the build tools (dpkg-dev, debhelper, python3-venv) they
skip, unless $CI is set: in CI that is a failure.
"""

import fcntl
import fnmatch
import glob
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import corral_systemd

ROOT = Path(__file__).resolve().parent.parent
PKG = "corral-systemd"
MODES = {"auto", "enforced", "fallback"}


def _unavailable(reason: str):
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (required when $CI is set)")
    pytest.skip(reason)


def _dpkg_installed() -> bool:
    proc = subprocess.run(["dpkg-query", "-W", "-f=${Status}", PKG], capture_output=True, text=True)
    return proc.returncode == 0 and "ok installed" in proc.stdout


def _complete(script: Path, prog: str, words: list[str], path: str) -> list[str]:
    """Source a bash completion script, call its function as bash would, return COMPREPLY."""
    func = "_" + prog.replace("-", "_") + "_completion"
    quoted = " ".join("'" + w.replace("'", "'\\''") + "'" for w in words)
    code = (
        f"source {str(script)!r} || exit 3\n"
        f"complete -p {prog} >/dev/null || exit 4\n"
        f"COMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}\n"
        f"{func} {prog} || exit 5\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    env = {"PATH": path, "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8"}
    proc = subprocess.run(
        ["bash", "--noprofile", "--norc", "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return [line for line in proc.stdout.splitlines() if line]


# --- completions generated from the source tree (fast) ----------------------------------------


@pytest.mark.parametrize("prog,fn", [("corral", "entry"), ("corral-enforced", "entry_enforced")])
def test_bash_completion_from_source_completes_cgroup_mode(tmp_path, prog, fn):
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    launcher = f"from corral_systemd.client import {fn}; {fn}()"
    shim = tmp_path / prog  # what the completion function runs: `$1` found on PATH
    shim.write_text(f"#!/bin/sh\nexec {sys.executable} -c '{launcher}' \"$@\"\n")
    shim.chmod(0o755)
    var = "_" + prog.replace("-", "_").upper() + "_COMPLETE"
    script = subprocess.run(
        [str(shim)], env=dict(os.environ, **{var: "source_bash"}), capture_output=True, text=True, check=True
    ).stdout
    assert f"complete -o default -F _{prog.replace('-', '_')}_completion {prog}" in script
    (tmp_path / "completion.bash").write_text(script)
    path = f"{tmp_path}:/usr/bin:/bin"
    assert set(_complete(tmp_path / "completion.bash", prog, [prog, "--cgroup-mode", ""], path)) == MODES
    assert set(_complete(tmp_path / "completion.bash", prog, [prog, "--cgroup-m"], path)) == {"--cgroup-mode"}


def test_bash_completion_from_source_completes_corralctl_commands(tmp_path):
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    shim = tmp_path / "corralctl"
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m corral_systemd.ctl "$@"\n')
    shim.chmod(0o755)
    script = subprocess.run(
        [str(shim)], env=dict(os.environ, _CORRALCTL_COMPLETE="source_bash"), capture_output=True, text=True, check=True
    ).stdout
    assert "complete -o default -F _corralctl_completion corralctl" in script
    (tmp_path / "completion.bash").write_text(script)
    _check_corralctl_completion(tmp_path / "completion.bash", f"{tmp_path}:/usr/bin:/bin")


def _check_corralctl_completion(script: Path, path: str) -> None:
    assert set(_complete(script, "corralctl", ["corralctl", "st"], path)) == {"status", "stop"}
    assert set(_complete(script, "corralctl", ["corralctl", "audit", ""], path)) == {"verify"}
    assert "--keep-finished" in _complete(script, "corralctl", ["corralctl", "gc", "--k"], path)


# --- the Debian package (slow) ------------------------------------------------------------------


def _build(out: Path) -> Path:
    given = os.environ.get("CORRAL_DEB")
    if given:
        assert Path(given).is_file(), f"$CORRAL_DEB={given} does not exist"
        return Path(given)
    for tool in ("dpkg-buildpackage", "dh", "dpkg-deb"):
        if shutil.which(tool) is None:
            _unavailable(f"{tool} is not installed (Debian: dpkg-dev, debhelper)")
    if subprocess.run(["/usr/bin/python3", "-c", "import ensurepip, venv"], capture_output=True).returncode:
        _unavailable("/usr/bin/python3 cannot make venvs (Debian: python3-venv)")
    out.mkdir()
    proc = subprocess.run(
        [str(ROOT / "packaging" / "build-deb"), str(out)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    path = Path(proc.stdout.strip().splitlines()[-1])
    assert path.is_file() and path.parent == out
    return path


def _man_excluded() -> bool:
    """Whether dpkg is configured (as in slim Docker images) not to install man pages."""
    for cfg in glob.glob("/etc/dpkg/dpkg.cfg.d/*") + ["/etc/dpkg/dpkg.cfg"]:
        try:
            lines = Path(cfg).read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            if line.startswith("path-exclude") and fnmatch.fnmatch(
                "/usr/share/man/man1/corral.1.gz", line.split("=", 1)[-1].strip()
            ):
                return True
    return False


def _check_deb_metadata(deb, tmp_path):
    fields = subprocess.run(
        ["dpkg-deb", "-f", str(deb), "Package", "Version", "Depends"], capture_output=True, text=True, check=True
    ).stdout
    assert f"Package: {PKG}" in fields
    assert f"Version: {corral_systemd.__version__}-1" in fields
    assert "python3." in fields  # the interpreter the venv was built for
    files = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True, check=True).stdout
    for path in (
        "./usr/bin/corral",
        "./usr/bin/corral-enforced",
        "./usr/bin/corralctl",
        "./usr/lib/corral-systemd/pyvenv.cfg",
        "./usr/lib/corral-systemd/corral-inprocess",
        "./usr/share/man/man1/corral.1.gz",
        "./usr/share/man/man1/corral-enforced.1.gz",
        "./usr/share/man/man1/corralctl.1.gz",
        "./usr/share/bash-completion/completions/corral",
        "./usr/share/bash-completion/completions/corral-enforced",
        "./usr/share/bash-completion/completions/corralctl",
        "./usr/share/zsh/vendor-completions/_corral",
        "./usr/share/fish/vendor_completions.d/corral.fish",
        "./usr/share/zsh/vendor-completions/_corralctl",
        "./usr/share/fish/vendor_completions.d/corralctl.fish",
        "./usr/lib/systemd/system/corral.slice",
        "./usr/lib/systemd/user/corral.slice",
        "./usr/lib/systemd/system/corral.socket",
        "./usr/lib/systemd/system/corral.service",
        "./usr/lib/systemd/user/corral.socket",
        "./usr/lib/systemd/user/corral.service",
    ):
        assert f" {path}" in files, f"{path} not in the package"
    # The compiled helpers, where the package looks for them (engines/libexec.py).
    for helper in ("corral-pidns-init", "corral-tether", "corral-gate"):
        assert f"/corral_systemd/libexec/{helper}\n" in files, f"{helper} not in the package"
    # Nothing for the system Python: no dist-packages, no /usr/local.
    assert "dist-packages" not in files and "./usr/local" not in files


def _check_installed_version(deb, tmp_path):
    for prog in ("corral", "corral-enforced"):
        proc = subprocess.run([f"/usr/bin/{prog}", "--version"], capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == f"corral {corral_systemd.__version__}"


def _check_installed_runs_a_command(deb, tmp_path):
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}  # nothing from the test venv
    proc = subprocess.run(
        ["/usr/bin/corral", "--cgroup-mode", "fallback", "--wall", "1s", "--", "true"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    assert "exit 0" in proc.stderr
    proc = subprocess.run(
        [
            "/usr/bin/corral",
            "--cgroup-mode",
            "fallback",
            "--wall",
            "300ms",
            "--grace",
            "200ms",
            "--",
            "sh",
            "-c",
            "sleep 30 & sleep 30",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=30,
    )
    assert proc.returncode == 124, proc.stderr
    proc = subprocess.run(
        ["/usr/bin/corral", "--bogus", "--", "true"], capture_output=True, text=True, env=env, timeout=30
    )
    assert proc.returncode == 125


def _check_installed_corralctl(deb, tmp_path):
    """The installed corralctl: --help, and the registry of a run of the installed corral."""
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "CORRAL_STATE_DIR": str(tmp_path / "state")}
    proc = subprocess.run(["/usr/bin/corralctl", "--help"], capture_output=True, text=True, env=env, timeout=30)
    assert proc.returncode == 0, proc.stderr
    for command in ("ps", "status", "stop", "gc", "audit"):
        assert re.search(rf"^  {command}\s", proc.stdout, re.M), proc.stdout
    proc = subprocess.run(["/usr/bin/corralctl", "gc", "--help"], capture_output=True, text=True, env=env, timeout=30)
    assert proc.returncode == 0 and "--keep-finished" in proc.stdout, proc.stderr
    proc = subprocess.run(
        ["/usr/bin/corral", "--cgroup-mode", "fallback", "--", "true"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    [entry] = (tmp_path / "state").glob("*.json")
    run = subprocess.run(
        ["/usr/bin/corralctl", "status", entry.stem], capture_output=True, text=True, env=env, timeout=30
    )
    assert run.returncode == 11 and run.stdout.startswith("finished"), run.stdout + run.stderr
    run = subprocess.run(
        ["/usr/bin/corralctl", "audit", "verify", entry.stem], capture_output=True, text=True, env=env, timeout=30
    )
    assert run.returncode == 0 and "OK" in run.stdout, run.stdout + run.stderr
    proc = subprocess.run(
        ["/usr/bin/corralctl", "gc", "--keep-finished", "soon"], capture_output=True, text=True, env=env, timeout=30
    )
    assert proc.returncode == 125 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def _check_installed_is_isolated_from_system_python(deb, tmp_path):
    # The system interpreter does not see the package ...
    proc = subprocess.run(
        ["/usr/bin/python3", "-I", "-c", "import corral_systemd"], capture_output=True, text=True, cwd=tmp_path
    )
    assert proc.returncode != 0 and "ModuleNotFoundError" in proc.stderr
    # corral and corral-enforced are the compiled client (no interpreter
    # until a run goes in-process through corral-inprocess) ...
    for prog in ("corral", "corral-enforced"):
        with open(f"/usr/bin/{prog}", "rb") as f:
            assert f.read(4) == b"\x7fELF", prog
    # ... and PYTHONPATH cannot shadow what the wrappers run.
    fake = tmp_path / "corral_systemd"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise SystemExit('shadowed')\n")
    for argv in (["/usr/bin/corral", "--version"], ["/usr/bin/corralctl", "--help"]):
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path)},
            timeout=30,
        )
        assert proc.returncode == 0 and "shadowed" not in proc.stderr, proc.stderr
    listed = subprocess.run(["dpkg", "-L", PKG], capture_output=True, text=True, check=True).stdout.splitlines()
    assert not [p for p in listed if p.startswith(("/usr/lib/python3/", "/usr/local/"))]


def _check_installed_man_pages(deb, tmp_path):
    subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp_path)], check=True)
    for page in ("corral", "corral-enforced", "corralctl"):
        path = tmp_path / "usr/share/man/man1" / f"{page}.1.gz"
        proc = subprocess.run(
            ["man", "--warnings", "-l", str(path)],
            capture_output=True,
            text=True,
            env=dict(os.environ, MANPAGER="cat", PAGER="cat", MANWIDTH="80"),
            timeout=60,
        )
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr
        assert "EXIT STATUS" in proc.stdout
    if _man_excluded():
        print("dpkg here excludes /usr/share/man (path-exclude): man -w not checked")
        return
    for page in ("corral", "corral-enforced", "corralctl"):
        proc = subprocess.run(["man", "-w", page], capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == f"/usr/share/man/man1/{page}.1.gz"


def _check_installed_bash_completion(deb, tmp_path):
    for prog in ("corral", "corral-enforced"):
        script = Path("/usr/share/bash-completion/completions") / prog
        assert set(_complete(script, prog, [prog, "--cgroup-mode", ""], "/usr/bin:/bin")) == MODES
        assert set(_complete(script, prog, [prog, "--stdin", ""], "/usr/bin:/bin")) == {"null", "inherit", "keep"}
        assert set(_complete(script, prog, [prog, "--cgroup-"], "/usr/bin:/bin")) == {
            "--cgroup-mode",
            "--cgroup-parent",
        }
    _check_corralctl_completion(Path("/usr/share/bash-completion/completions/corralctl"), "/usr/bin:/bin")


def _check_installed_zsh_and_fish_completions(deb, tmp_path):
    for prog in ("corral", "corral-enforced", "corralctl"):
        zsh = Path("/usr/share/zsh/vendor-completions") / f"_{prog}"
        fish = Path("/usr/share/fish/vendor_completions.d") / f"{prog}.fish"
        assert zsh.read_text().startswith(f"#compdef {prog}\n")  # autoloadable from fpath
        assert "complete_zsh" in zsh.read_text()
        assert f"--command {prog} " in fish.read_text()
        for shell, path in (("zsh", zsh), ("fish", fish)):
            if shutil.which(shell):
                proc = subprocess.run([shell, "-n", str(path)], capture_output=True, text=True, timeout=30)
                assert proc.returncode == 0, proc.stderr


def _check_installed_slices(deb, tmp_path):
    for manager in ("system", "user"):
        text = Path(f"/usr/lib/systemd/{manager}/corral.slice").read_text()
        assert "[Slice]" in text
        active = [
            line
            for line in text.splitlines()
            if line.strip() and not line.startswith("#") and "=" in line and not line.startswith("[")
        ]
        # Only [Unit] metadata is active; every limit is a commented example.
        assert {line.split("=")[0] for line in active} <= {"Description", "Documentation", "Before"}
        for limit in ("MemoryMax", "TasksMax", "CPUQuota"):
            assert f"#{limit}=" in text
        verify = shutil.which("systemd-analyze")
        if verify:
            # With every example uncommented, systemd accepts every key and value.
            examples = tmp_path / manager / "corral.slice"
            examples.parent.mkdir(parents=True)
            examples.write_text(re.sub(r"^#([A-Z][A-Za-z]+=)", r"\1", text, flags=re.M))
            assert "\nMemoryMax=" in examples.read_text()
            proc = subprocess.run(
                [verify, "verify", "--man=no", str(examples)], capture_output=True, text=True, timeout=60
            )
            assert proc.returncode == 0 and "corral.slice" not in proc.stderr, proc.stderr


def _check_remove_leaves_nothing(deb, tmp_path):
    assert _dpkg_installed()
    # Runs above must not have written files dpkg does not know (e.g. byte-code).
    listed = set(subprocess.run(["dpkg", "-L", PKG], capture_output=True, text=True, check=True).stdout.split("\n"))
    extra = [
        os.path.join(d, f)
        for d, dirs, files in os.walk("/usr/lib/corral-systemd")
        for f in files + dirs
        if os.path.join(d, f) not in listed
    ]
    assert not extra, f"files not owned by the package: {extra[:10]}"
    proc = subprocess.run(["dpkg", "-r", PKG], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    for path in (
        "/usr/bin/corral",
        "/usr/bin/corral-enforced",
        "/usr/bin/corralctl",
        "/usr/lib/corral-systemd",
        "/usr/share/man/man1/corralctl.1.gz",
        "/usr/lib/systemd/system/corral.slice",
        "/usr/share/bash-completion/completions/corral",
        *_SOCKET_LINKS,
    ):
        assert not os.path.lexists(path), f"{path} left after dpkg -r"


#: Where an enabled corral.socket would be linked.
_SOCKET_LINKS = (
    "/etc/systemd/system/sockets.target.wants/corral.socket",
    "/etc/systemd/user/sockets.target.wants/corral.socket",
)


@pytest.mark.slow
def test_deb_build_install_run_remove(tmp_path):
    """Build, check, ``dpkg -i``, run the installed files, ``dpkg -r``.

    One test on purpose: pytest-xdist (tests/run uses -n 4) could otherwise
    split install, checks and removal across workers. A lock file keeps two
    test sessions on one machine from installing at the same time.
    """
    deb = _build(tmp_path / "deb")
    _check_deb_metadata(deb, tmp_path)
    if os.geteuid() != 0:
        _unavailable("installing the .deb needs root")
    with open("/run/lock/corral-systemd-test-deb.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        was_installed = _dpkg_installed()
        try:
            proc = subprocess.run(["dpkg", "-i", str(deb)], capture_output=True, text=True, timeout=300)
            assert proc.returncode == 0, proc.stdout + proc.stderr
            # The corral service is shipped disabled: dpkg enables nothing.
            assert "Created symlink" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
            assert not [p for p in _SOCKET_LINKS if os.path.lexists(p)]
            for check in (
                _check_installed_version,
                _check_installed_runs_a_command,
                _check_installed_corralctl,
                _check_installed_is_isolated_from_system_python,
                _check_installed_man_pages,
                _check_installed_bash_completion,
                _check_installed_zsh_and_fish_completions,
                _check_installed_slices,
            ):
                work = tmp_path / check.__name__
                work.mkdir()
                check(deb, work)
            if not was_installed:
                _check_remove_leaves_nothing(deb, tmp_path)
        finally:
            if not was_installed and _dpkg_installed():
                subprocess.run(["dpkg", "-r", PKG], capture_output=True, timeout=300)


def test_build_deb_names_its_missing_build_dependencies(tmp_path):
    """Without its tools (an empty PATH), build-deb says in one line which Debian packages
    it needs and how to get them, and builds nothing."""
    out = tmp_path / "out"
    proc = subprocess.run(
        ["/bin/sh", str(ROOT / "packaging" / "build-deb"), str(out)],
        env={"PATH": str(tmp_path / "nothing")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1 and proc.stdout == "", proc
    (line,) = proc.stderr.splitlines()
    assert line.startswith("build-deb: missing build dependencies:") and "apt-get install" in line, line
    for package in ("dpkg-dev", "debhelper", "groff-base"):
        assert package in line
    assert not out.exists()
