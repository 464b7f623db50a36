"""Ctrl-C for `ros2 launch`: the first entity of Tether's launch files (launch/*.launch.py).

    LaunchDescription([sigint_without_keyboard_interrupt(), DeclareLaunchArgument(...), Node(...)])

`ros2 launch` (launch 3.4, Jazzy; the same code upstream) learns of SIGINT through
`signal.set_wakeup_fd` and shuts its processes down from its event loop (SIGINT to each, SIGTERM
after `sigterm_timeout`, SIGKILL after `sigkill_timeout`). It keeps Python's default SIGINT handler
as well, so the same signal also raises KeyboardInterrupt wherever its main thread happens to be.
Idle in `select()` that is harmless; busy (starting processes, relaying their output) it can land
inside asyncio's own bookkeeping and lose a wake-up: the Shutdown event then waits in the queue
for ever, no process is signalled and launch never exits (tests/ros2/launch_ctrl_c_stress.py: 5 of
100 Ctrl-Cs hung a launch relaying 5k lines/s; 0 of 100 with this action). The action
replaces that handler with one that does nothing, in the launch process only: the C-level handler
still writes the wakeup fd, so launch's own handling is unchanged (first Ctrl-C: shut down, a
second: ignored, as before), minus the stray KeyboardInterrupt.
"""

from __future__ import annotations

import signal
import threading

__all__ = ["sigint_without_keyboard_interrupt"]


def _leave_sigint_to_the_event_loop(*_: object) -> None:
    """SIGINT handler: nothing here; launch reads the signal from its wakeup fd."""


def _install(context: object, *_: object) -> None:
    if threading.current_thread() is threading.main_thread():   # signal.signal works there only
        signal.signal(signal.SIGINT, _leave_sigint_to_the_event_loop)


def sigint_without_keyboard_interrupt():
    """A launch action (`OpaqueFunction`) that keeps SIGINT from raising KeyboardInterrupt in `ros2 launch`."""
    from launch.actions import OpaqueFunction  # the ROS environment's; this module imports anywhere

    return OpaqueFunction(function=_install)
