"""The core: the life of a request between the routes and the device.

`service` is the front door (typed requests in, typed results out); `scheduler` owns the
queue's whole state (the gate, the waiting, the running) and starts work on the
executor through `runs`; `pricing`, `memory` and `failures` are its narrow
collaborators; `lifecycle` loads and unloads models; `health` keeps readiness and the
watchdog; `snapshot` is the one picture of it all that /status, /metrics and the history
read.
"""
