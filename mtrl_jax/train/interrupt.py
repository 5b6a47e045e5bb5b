"""A Ctrl-C that cannot be lost while actor threads are running.

Python delivers SIGINT as a KeyboardInterrupt raised wherever the main thread
happens to be executing bytecode. Most of the time that is a wait in our own
code, but it can also be inside a library: a bare `except:` (there are several
in JAX's tracing code, e.g. `core.is_constant_dim`), a C extension that clears
the error indicator, a `__del__` or a weakref callback. There the exception
is swallowed and the program carries on as if no key had been pressed, with
the actors playing on: the user's Ctrl-C is ignored.

`InterruptLatch` makes the interrupt sticky. While it is installed, SIGINT
first records itself and runs the caller's `on_interrupt` (the async source
closes its queue, which stops the actors and wakes every waiter), then raises
KeyboardInterrupt as the default handler does. Code that polls `check()` at
its next boundary (every `next_batch` and `publish`) re-raises it, so a
swallowed interrupt surfaces at the latest at the next call.

It only installs itself on the main thread and only over Python's default
handler: a handler the user installed is left alone.
"""
from __future__ import annotations

import signal
import threading
from typing import Callable


class InterruptLatch:
  """Records SIGINT, runs `on_interrupt`, then raises KeyboardInterrupt (see module doc)."""

  def __init__(self, on_interrupt: Callable[[], None] | None = None):
    self._on_interrupt = on_interrupt
    self._event = threading.Event()
    self._installed = False
    if threading.current_thread() is threading.main_thread() and \
        signal.getsignal(signal.SIGINT) is signal.default_int_handler:
      signal.signal(signal.SIGINT, self._handle)
      self._installed = True

  @property
  def installed(self) -> bool:
    return self._installed

  @property
  def interrupted(self) -> bool:
    return self._event.is_set()

  def _handle(self, signum, frame):
    self._event.set()
    if self._on_interrupt is not None:
      self._on_interrupt()
    raise KeyboardInterrupt

  def check(self) -> None:
    """Raises KeyboardInterrupt if SIGINT arrived since installation (again, if it was swallowed)."""
    if self._event.is_set():
      raise KeyboardInterrupt("Ctrl-C received earlier (re-raised: the first KeyboardInterrupt was lost)")

  def uninstall(self) -> None:
    """Puts Python's default handler back (if this latch is still the one installed); idempotent."""
    if not self._installed:
      return
    self._installed = False
    if threading.current_thread() is threading.main_thread() and \
        signal.getsignal(signal.SIGINT) == self._handle:
      signal.signal(signal.SIGINT, signal.default_int_handler)
