"""Child processes (`radixkv.procs.become_child`): a child's progress bars leave nothing for the
parent's resource tracker to report at exit."""

import subprocess
import sys
import textwrap

import pytest

PARENT = textwrap.dedent('''
    import multiprocessing, os, sys

    def child(parent_pid, fixed):
        if fixed:
            from radixkv.procs import become_child
            become_child(parent_pid, "warning", "test")
        from tqdm import tqdm
        for _ in tqdm(range(3), disable=False, file=sys.stderr):  # the model load's bar, in short
            pass
        from radixkv.procs import exit_now
        exit_now(0)  # as the server's children leave: no interpreter teardown

    if __name__ == "__main__":
        ctx = multiprocessing.get_context("spawn")  # as the server starts its children
        p = ctx.Process(target=child, args=(os.getpid(), sys.argv[1] == "fixed"))
        p.start()
        p.join()
        assert p.exitcode == 0, p.exitcode
''')


@pytest.mark.parametrize("fixed", [False, True])
def test_a_childs_progress_bar_leaks_no_semaphore(tmp_path, fixed):
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    done = subprocess.run([sys.executable, str(script), "fixed" if fixed else "plain"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    leaked = "leaked semaphore" in done.stderr
    assert leaked is not fixed, done.stderr  # tqdm's own lock leaks one: the reason for the fix
