"""The serving core, apart from HTTP: admission, input processing, n/best_of, timeouts, the one fold of
events into a result, sessions lookup and request metrics. No Tornado here; the server's handlers parse,
call ``Frontend``, encode and write."""
from mindie_service.serving.frontend import Frontend, SessionClaims, Submission
from mindie_service.serving.observer import NullObserver, RequestObserver, RequestTally
from mindie_service.serving.streams import Run, Timeouts, fan_out, fold

__all__ = ["Frontend", "NullObserver", "RequestObserver", "RequestTally", "Run", "SessionClaims", "Submission",
           "Timeouts", "fan_out", "fold"]
