"""InterruptLatch: installs over Python's default SIGINT handler only, on the
main thread only, records a Ctrl-C even when the KeyboardInterrupt is eaten,
and puts the default handler back."""
import signal
import threading

import pytest

from mtrl_jax.train.interrupt import InterruptLatch


@pytest.fixture(autouse=True)
def default_sigint():
  old = signal.signal(signal.SIGINT, signal.default_int_handler)
  yield
  signal.signal(signal.SIGINT, old)


def test_records_runs_the_callback_raises_and_raises_again_after_a_swallow():
  calls = []
  latch = InterruptLatch(on_interrupt=lambda: calls.append(1))
  assert latch.installed and not latch.interrupted
  latch.check()  # nothing yet
  with pytest.raises(KeyboardInterrupt):
    signal.raise_signal(signal.SIGINT)
  assert calls == [1] and latch.interrupted
  with pytest.raises(KeyboardInterrupt, match="re-raised"):
    latch.check()
  latch.uninstall()
  assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
  latch.uninstall()  # idempotent


def test_a_handler_the_user_installed_is_left_alone():
  mine = lambda signum, frame: None  # noqa: E731
  signal.signal(signal.SIGINT, mine)
  latch = InterruptLatch()
  assert not latch.installed
  signal.raise_signal(signal.SIGINT)  # the user's handler: nothing raised, nothing recorded
  latch.check()
  latch.uninstall()
  assert signal.getsignal(signal.SIGINT) is mine


def test_not_installed_off_the_main_thread():
  out = []
  th = threading.Thread(target=lambda: out.append(InterruptLatch().installed))
  th.start()
  th.join()
  assert out == [False]
  assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
