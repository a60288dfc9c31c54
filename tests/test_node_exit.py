"""A node that dies during start-up is named with how it ended (a signal by name, with its likely sender) and the
end of its log, or the word that its log is empty: never "exited with code -9" and nothing after it.
A node starting says what it is doing: its log's last line."""
from __future__ import annotations

import pytest

from edgeinfer.procs.node_spec import NodeSpec
from edgeinfer.procs.nodes import Node, NodeGroup


class _Ended:
    """A process that has already ended with `returncode` (subprocess.Popen's convention: -N after signal N)."""

    def __init__(self, returncode: int):
        self.returncode, self.pid = returncode, 0

    def poll(self) -> int:
        return self.returncode


def _dead(tmp_path, returncode: int, log_text: str | None) -> Node:
    log = tmp_path / "runtime.log"
    if log_text is not None:
        log.write_text(log_text)
    return Node(NodeSpec("serve", (), "runtime", log), _Ended(returncode))


@pytest.mark.parametrize("code, log_text, match", [
    (-9, "", r"(?s)runtime process was killed by SIGKILL \(exit code -9: the kernel's OOM killer, if no one ran "
             r"kill -9 \(dmesg names its victims\)\) during start-up:\n\(its log .*runtime\.log is empty: it died "
             r"before writing a line\)$"),
    (-11, "loading engine\n", r"(?s)runtime process was killed by SIGSEGV \(exit code -11: a crash in native code.*"
                              r"during start-up:\nloading engine\n$"),
    (-15, "bye\n", r"(?s)runtime process was killed by SIGTERM \(exit code -15\) during start-up:\nbye\n$"),
    (2, "usage: edgeinfer serve --obs\n", r"(?s)runtime process exited with code 2 during start-up:\nusage: .*--obs"),
    (1, None, r"(?s)runtime process exited with code 1 during start-up:\n\(no log\)$"),
])
def test_start_up_death_says_how_and_shows_the_log(tmp_path, code, log_text, match):
    node = _dead(tmp_path, code, log_text)
    with pytest.raises(RuntimeError, match=match):
        NodeGroup().check_started([node])


def test_a_starting_node_says_what_it_is_doing_by_the_last_status_line_of_its_log(tmp_path):
    """Node.status_line: what a replay's start-up progress shows beside its label (a wait for a compile, say): the
    nodes' own "who: what" lines, never a library warning's source line, a terminal escape or a control byte."""
    node = Node(NodeSpec("serve", (), "runtime", tmp_path / "runtime.log"), _Ended(0))
    assert node.status_line() == ""  # no log yet
    node.spec.log.write_text("")
    assert node.status_line() == ""
    waiting = "engine: waiting for process 7 to finish compiling the fused kernels"
    warning = ("/x/torch/onnx/_export.py:12: UserWarning: a rename mapping\n"
               "  rename_mapping = _dynamic_shapes.create_rename_mapping(\n")
    node.spec.log.write_text("x" * 10_000 + "\nruntime: loading\n" + waiting + "\n" + warning)
    assert node.status_line() == waiting
    node.spec.log.write_text("runtime: \x1b[31mred\x1b[0m \x1b[2J\x1b[1A\x1b]0;TITLE\x07title\x00\x01\x1b7 done\r\n")
    assert node.status_line() == "runtime: red title done"
    node.spec.log.write_text("runtime: " + "y" * 200)
    assert node.status_line() == "runtime: " + "y" * 90 + "…"  # 100 characters
    node.spec.log.write_text("y" * 10_000)  # no status line in the end of the log
    assert node.status_line() == ""
    assert Node(NodeSpec("serve", (), "runtime", None), _Ended(0)).status_line() == ""  # a node without a log
