"""HTTP headers the handler reads and writes besides the body's content type."""

# Answered on every request: how many requests shared the handler call (TorchServe's batch).
BATCH_REQUESTS = "X-Batch-Requests"
# The worker's process id is answered (as WORKER_PID) only to a request that carries REPORT_WORKER_PID: the
# hot-swap's drain, the tests and the memory probe ask for it; other clients are not told a process id, and the
# pod's gateway drops the request header from outside callers.
REPORT_WORKER_PID = "X-Report-Worker-Pid"
WORKER_PID = "X-Worker-Pid"


def asks_worker_pid(headers: dict) -> bool:
    """Whether a request's headers (context.get_all_request_header) ask for the worker's pid."""
    wanted = REPORT_WORKER_PID.lower()
    return any(str(name).lower() == wanted for name in headers)
