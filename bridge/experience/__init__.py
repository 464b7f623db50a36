"""The durable experience log (MCAP segments), its reader, the `tether.v1.Experience` stream and `tether log`.

    log = ExperienceLog(run_dir / "experience")
    await log.start()
    offset = await log.append(transition)      # durable once this resolves
    for t in read_transitions(run_dir / "experience"):
        ...
"""

from bridge.experience.log import ExperienceLog, LogError, LogStats
from bridge.experience.reader import LogCursor, read_transitions

__all__ = ["ExperienceLog", "LogCursor", "LogError", "LogStats", "read_transitions"]
