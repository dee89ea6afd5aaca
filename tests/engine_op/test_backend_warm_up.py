"""A calibrating conversion starts loading the engine backend's libraries on a background thread while it loads the
model: once per process, on the backend the engine ops will use; a failure there is left for the engine ops to
report."""
import logging

from tftrt_py.engine_op import op


class Stub:
    def __init__(self, fail=False):
        self.fail, self.warmed = fail, 0

    def warm_up(self):
        self.warmed += 1
        if self.fail:
            raise RuntimeError("no libraries here")


def test_the_backend_is_warmed_up_once_on_a_background_thread(monkeypatch):
    stub, asked = Stub(), []
    monkeypatch.setattr(op, "_warm_up", None)
    monkeypatch.setattr(op, "get_backend", lambda name: asked.append(name) or stub)
    thread = op.warm_up_backend()
    assert op.warm_up_backend() is thread and thread.daemon
    thread.join(10)
    assert not thread.is_alive() and stub.warmed == 1 and asked == [op.engine_backend()]


def test_a_failing_warm_up_is_logged_not_raised(monkeypatch, caplog):
    monkeypatch.setattr(op, "_warm_up", None)
    monkeypatch.setattr(op, "get_backend", lambda name: Stub(fail=True))
    with caplog.at_level(logging.DEBUG, logger=op.__name__):
        op.warm_up_backend().join(10)
    assert "no libraries here" in caplog.text
