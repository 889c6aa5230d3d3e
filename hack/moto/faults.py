"""Fault injection in the AWS emulator: EC2 calls that fail or hang the way EC2's do.

A WSGI middleware in front of moto (hack/moto/server.py installs it, and serves
/_karpenter-rs/faults to arm it). Armed with a fault for an EC2 action, it answers the next
`count` calls of that action itself, as EC2 would answer them when it is out of capacity,
throttling or failing, or holds them `seconds` before moto sees them:

    POST /_karpenter-rs/faults  {"action": "CreateFleet", "error": "InsufficientInstanceCapacity",
                                 "count": 2}
                                {"action": "TerminateInstances", "error": "InternalError"}
                                {"action": "CreateFleet", "error": "stall", "seconds": 20}

Errors and what the caller gets
-------------------------------
* InsufficientInstanceCapacity: for CreateFleet (an `instant` fleet), EC2's answer to a fleet
  it could not fill: HTTP 200, a fleet id, no instances, and one error item per override of
  the request (its launch template, instance type, subnet and zone), code
  InsufficientInstanceCapacity. With "overrides": N, only the first N overrides of the request
  are named (the offerings EC2 found without capacity; Karpenter lists them cheapest first), so
  that a caller who leaves out what was named can launch the next one. For any other action
  (RunInstances, StartInstances), the error document below with HTTP 500 (a server error in
  EC2's list of error codes).
* RequestLimitExceeded (throttling): HTTP 503.
* InternalError: HTTP 500. ServiceUnavailable, Unavailable: HTTP 503.
* Any other error code, given with "status" (400-599): that code and status.
* stall: nothing is answered for `seconds` (default 30); then the call goes on to moto and
  its answer is returned. A caller that gives up meanwhile still gets the call executed,
  as when EC2 acts on a request whose answer is lost.

The error document is EC2's query-protocol one:

    <?xml version="1.0" encoding="UTF-8"?>
    <Response><Errors><Error><Code>RequestLimitExceeded</Code><Message>Request limit
    exceeded.</Message></Error></Errors><RequestID>...</RequestID></Response>

With "after": true, the call is executed by moto first and its answer replaced by the error
(a lost answer: EC2 acted, the caller was told it failed); with "stall", the answer is held
back `seconds` after moto acted.

Which calls
-----------
By default only the controller's calls (user agent with `app/karpenter-rs`, as in
hack/moto/call_log.py), so that the tests' own SDK clients and the kubelet stand-in (which
also calls DescribeInstances) keep seeing a healthy EC2; "any_client": true faults every
caller. Only EC2 (the query protocol, the service named by the request's signature) is
faulted. Several faults of one action are used in the order they were armed; a fault is
gone once its `count` calls were answered.

A dry run (`DryRun=true`, as the controller's validation of an EC2NodeClass makes) is
throttled, failed and stalled like any call, but never out of capacity: an
InsufficientInstanceCapacity fault passes it by and waits for a real launch.

GET /_karpenter-rs/faults tells the faults still armed ("pending") and those injected so
far ("injected", the latest 1000, and "counts" by "<Action> <error>"); DELETE disarms every
pending fault. Faulted calls never reach the call log (except those with "after": true,
which moto executes).
"""

from __future__ import annotations

import datetime
import itertools
import re
import threading
import time
import uuid
from typing import Any, Callable, Iterable
from xml.sax.saxutils import escape

import call_log

# HTTP status EC2 answers each error code with.
STATUS = {
    "InsufficientInstanceCapacity": 500,
    "InternalError": 500,
    "RequestLimitExceeded": 503,
    "ServiceUnavailable": 503,
    "Unavailable": 503,
}
MESSAGES = {
    "InternalError": "An internal error has occurred.",
    "RequestLimitExceeded": "Request limit exceeded.",
    "ServiceUnavailable": "The server is overloaded and can't handle the request.",
    "Unavailable": "The server is overloaded and can't handle the request.",
}
STALL = "stall"
DEFAULT_STALL_SECONDS = 30.0
MAX_STALL_SECONDS = 600.0
HISTORY = 1000
EC2_NAMESPACE = "http://ec2.amazonaws.com/doc/2016-11-15/"

_CREDENTIAL = re.compile(r"Credential=([^/,\s]+)/(\d{8})/([^/]+)/([^/]+)/aws4_request")
_CODE = re.compile(r"^[A-Za-z][A-Za-z0-9.]{0,99}$")
_ACTION = re.compile(r"^[A-Z][A-Za-z0-9]{0,99}$")


class FaultError(ValueError):
    """A fault that cannot be armed (the endpoint answers 400)."""


def _elements(values: dict, fields: list[tuple[str, str]]) -> str:
    """`<tag>value</tag>` for each (tag, key) of `fields` whose value in `values` is set."""
    return "".join(f"<{tag}>{escape(values[key])}</{tag}>" for tag, key in fields if values[key])


def _ice_message(instance_type: str, zone: str) -> str:
    where = f" in the Availability Zone you requested ({zone})" if zone else ""
    return (
        f"We currently do not have sufficient {instance_type or 'instance'} capacity{where}. "
        "Our system will be working on provisioning additional capacity."
    )


class Ec2Error(Exception):
    """An EC2 error answer the emulator gives itself: code, message, HTTP status."""

    def __init__(self, code: str, message: str, status: int = 400):
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status


def ec2_response(action: str, inner: str) -> bytes:
    """EC2's query-protocol answer to `action`, holding the elements `inner`."""
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f'<{action}Response xmlns="{EC2_NAMESPACE}"><requestId>{uuid.uuid4()}</requestId>'
        f"{inner}</{action}Response>"
    ).encode()


def answer(start_response, status: int, data: bytes) -> list[bytes]:
    """Starts an XML answer of `status` with `data` and returns its body."""
    start_response(f"{status} {_reason(status)}",
                   [("Content-Type", "text/xml;charset=UTF-8"), ("Content-Length", str(len(data)))])
    return [data]


def error_document(code: str, message: str) -> bytes:
    """EC2's query-protocol error document."""
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Response><Errors><Error><Code>{escape(code)}</Code><Message>{escape(message)}</Message>"
        f"</Error></Errors><RequestID>{uuid.uuid4()}</RequestID></Response>"
    ).encode()


def fleet_override(config: dict[str, str], override: dict[str, str]) -> dict[str, str]:
    """One override of a CreateFleet request, with its launch template: {"template_id",
    "template_name", "version", "instance_type", "subnet_id", "zone"}, from the members of
    LaunchTemplateConfigs.N (`config`) and of its Overrides.M (`override`)."""
    return {
        "template_id": config.get("LaunchTemplateSpecification.LaunchTemplateId", ""),
        "template_name": config.get("LaunchTemplateSpecification.LaunchTemplateName", ""),
        "version": config.get("LaunchTemplateSpecification.Version", ""),
        "instance_type": override.get("InstanceType", ""),
        "subnet_id": override.get("SubnetId", ""),
        "zone": override.get("AvailabilityZone", ""),
    }


def fleet_overrides(params: dict[str, str]) -> list[dict[str, str]]:
    """The overrides of a CreateFleet request, each with its launch template (fleet_override)."""
    return [
        fleet_override(config, o)
        for config in call_log.indexed(params, "LaunchTemplateConfigs")
        for o in call_log.indexed(config, "Overrides") or [{}]
    ]


def fleet_error_item(override: dict[str, str], lifecycle: str, code: str, message: str) -> str:
    """One item of an instant fleet's errorSet: the override (its launch template, instance type,
    subnet and zone, as fleet_overrides gives it) EC2 could not launch, and why."""
    spec = _elements(override, [("launchTemplateId", "template_id"), ("launchTemplateName", "template_name"),
                                ("version", "version")])
    chosen = _elements(override, [("instanceType", "instance_type"), ("subnetId", "subnet_id"),
                                  ("availabilityZone", "zone")])
    return (
        "<item><launchTemplateAndOverrides>"
        f"<launchTemplateSpecification>{spec}</launchTemplateSpecification>"
        f"<overrides>{chosen}</overrides>"
        f"</launchTemplateAndOverrides><lifecycle>{escape(lifecycle)}</lifecycle>"
        f"<errorCode>{escape(code)}</errorCode>"
        f"<errorMessage>{escape(message)}</errorMessage></item>"
    )


def unfilled_fleet(items: list[str]) -> bytes:
    """EC2's answer to an instant fleet that launched nothing: HTTP 200, a fleet id, no instances,
    and the error items (fleet_error_item) saying why."""
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f'<CreateFleetResponse xmlns="{EC2_NAMESPACE}"><requestId>{uuid.uuid4()}</requestId>'
        f"<fleetId>fleet-{uuid.uuid4().hex[:17]}</fleetId><errorSet>{''.join(items)}</errorSet>"
        "<fleetInstanceSet/></CreateFleetResponse>"
    ).encode()


def fleet_lifecycle(params: dict[str, str]) -> str:
    """The lifecycle (on-demand or spot) a CreateFleet request launches by default."""
    return params.get("TargetCapacitySpecification.DefaultTargetCapacityType") or "on-demand"


def insufficient_capacity_fleet(params: dict[str, str], named: int | None = None) -> bytes:
    """EC2's answer to an instant fleet it could not fill: no instances, one
    InsufficientInstanceCapacity error per override (the first `named` ones only, if given)."""
    lifecycle = fleet_lifecycle(params)
    overrides = fleet_overrides(params)
    if named is not None:
        overrides = overrides[:named]
    return unfilled_fleet([
        fleet_error_item(o, lifecycle, "InsufficientInstanceCapacity", _ice_message(o["instance_type"], o["zone"]))
        for o in overrides
    ])


class Fault:
    """One armed fault."""

    _ids = itertools.count(1)

    def __init__(self, spec: dict[str, Any]):
        if not isinstance(spec, dict):
            raise FaultError("the body is a JSON object")
        unknown = set(spec) - {"action", "error", "count", "seconds", "status", "message", "after",
                               "any_client", "service", "overrides"}
        if unknown:
            raise FaultError(f"unknown field(s): {', '.join(sorted(unknown))}")
        self.action = str(spec.get("action") or "")
        if not _ACTION.match(self.action):
            raise FaultError(f"action {self.action!r} is not an EC2 action name such as CreateFleet")
        self.service = str(spec.get("service") or "ec2")
        if self.service != "ec2":
            raise FaultError("only EC2 (the query protocol) can be faulted")
        self.error = str(spec.get("error") or "")
        if not (self.error == STALL or _CODE.match(self.error)):
            raise FaultError(f"error {self.error!r} is neither an error code nor {STALL!r}")
        try:
            self.count = int(spec.get("count", 1))
        except (TypeError, ValueError):
            raise FaultError("count is a number") from None
        if self.count < 1:
            raise FaultError("count is at least 1")
        self.seconds = 0.0
        self.status = 0
        if self.error == STALL:
            try:
                self.seconds = float(spec.get("seconds", DEFAULT_STALL_SECONDS))
            except (TypeError, ValueError):
                raise FaultError("seconds is a number") from None
            if not 0 <= self.seconds <= MAX_STALL_SECONDS:
                raise FaultError(f"seconds is between 0 and {MAX_STALL_SECONDS:.0f}")
        else:
            status = spec.get("status", STATUS.get(self.error))
            if status is None:
                raise FaultError(f"give the HTTP status of error {self.error!r} (\"status\": 400-599)")
            try:
                self.status = int(status)
            except (TypeError, ValueError):
                raise FaultError("status is a number") from None
            if not 400 <= self.status <= 599:
                raise FaultError("status is between 400 and 599")
        self.message = str(spec.get("message") or MESSAGES.get(self.error, f"{self.error} (injected)."))
        self.overrides = None
        if spec.get("overrides") is not None:
            if self.error != "InsufficientInstanceCapacity" or self.action != "CreateFleet":
                raise FaultError("overrides is for CreateFleet's InsufficientInstanceCapacity")
            try:
                self.overrides = int(spec["overrides"])
            except (TypeError, ValueError):
                raise FaultError("overrides is a number") from None
            if self.overrides < 1:
                raise FaultError("overrides is at least 1")
        self.after = bool(spec.get("after", False))
        self.any_client = bool(spec.get("any_client", False))
        self.id = next(self._ids)
        self.left = self.count

    def describe(self) -> dict[str, Any]:
        out = {"id": self.id, "service": self.service, "action": self.action, "error": self.error,
               "count": self.count, "left": self.left, "after": self.after,
               "any_client": self.any_client}
        if self.error == STALL:
            out["seconds"] = self.seconds
        else:
            out["status"] = self.status
            out["message"] = self.message
        if self.overrides is not None:
            out["overrides"] = self.overrides
        return out


def call_captured(app, environ: dict) -> tuple[list[Any], bytes]:
    """Calls the WSGI `app` and returns its `[status, headers]` (empty when it started no
    response) and its whole body, for a middleware that answers after looking at it."""
    captured: list[Any] = []

    def capture(status, headers, exc_info=None):
        captured[:] = [status, headers]
        return lambda data: None

    chunks = app(environ, capture)
    try:
        answer = b"".join(chunks)
    finally:
        close = getattr(chunks, "close", None)
        if close:
            close()
    return captured, answer


def _service(environ: dict) -> str:
    match = _CREDENTIAL.search(environ.get("HTTP_AUTHORIZATION", ""))
    if match:
        return match.group(4)
    credential = (call_log.query_params(environ, b"").get("X-Amz-Credential") or "").split("/")
    return credential[3] if len(credential) > 3 else ""


class FaultInjector:
    """WSGI middleware answering armed faults (see the module's docstring)."""

    def __init__(self, app: Callable):
        self.app = app
        self.lock = threading.Lock()
        self.pending: list[Fault] = []
        self.injected: list[dict[str, Any]] = []
        self.counts: dict[str, int] = {}

    # -- the endpoint ---------------------------------------------------------

    def arm(self, spec: dict[str, Any]) -> dict[str, Any]:
        fault = Fault(spec)
        with self.lock:
            self.pending.append(fault)
            return {"armed": fault.describe(), "pending": [f.describe() for f in self.pending]}

    def disarm(self) -> dict[str, Any]:
        with self.lock:
            cleared, self.pending = self.pending, []
        return {"cleared": [f.describe() for f in cleared]}

    def status(self) -> dict[str, Any]:
        with self.lock:
            return {"pending": [f.describe() for f in self.pending], "injected": list(self.injected),
                    "counts": dict(self.counts)}

    # -- the middleware -------------------------------------------------------

    def _take(self, service: str, action: str, controller: bool, dry_run: bool) -> Fault | None:
        with self.lock:
            for fault in self.pending:
                # EC2 answers a dry run without looking for capacity.
                if dry_run and fault.error == "InsufficientInstanceCapacity":
                    continue
                if fault.action == action and fault.service == service and (controller or fault.any_client):
                    fault.left -= 1
                    if fault.left <= 0:
                        self.pending.remove(fault)
                    key = f"{action} {fault.error}"
                    self.counts[key] = self.counts.get(key, 0) + 1
                    status = 200 if _fleet_without_capacity(fault, action) else (fault.status or None)
                    self.injected.append({"id": fault.id, "time": _now(), "action": action,
                                          "error": fault.error, "status": status, "after": fault.after})
                    del self.injected[:-HISTORY]
                    return fault
        return None

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        if not self.pending:
            return self.app(environ, start_response)
        service = _service(environ)
        if service != "ec2":
            return self.app(environ, start_response)
        body = call_log.read_body(environ)
        params = call_log.query_params(environ, body)
        action = params.get("Action", "")
        dry_run = params.get("DryRun", "").lower() == "true"
        fault = self._take(service, action, call_log.is_controller(environ), dry_run)
        if fault is None:
            return self.app(environ, start_response)

        if fault.error == STALL and not fault.after:
            time.sleep(fault.seconds)
            return self.app(environ, start_response)
        if fault.after:
            captured, answer = call_captured(self.app, environ)
            if fault.error == STALL:
                time.sleep(fault.seconds)
                start_response(captured[0], captured[1])
                return [answer]

        if _fleet_without_capacity(fault, action):
            params = call_log.query_params(environ, body)
            status, data = "200 OK", insufficient_capacity_fleet(params, fault.overrides)
        else:
            status = f"{fault.status} {_reason(fault.status)}"
            data = error_document(fault.error, fault.message)
        headers = [("Content-Type", "text/xml;charset=UTF-8"), ("Content-Length", str(len(data)))]
        start_response(status, headers)
        return [data]


def _fleet_without_capacity(fault: Fault, action: str) -> bool:
    """CreateFleet's insufficient capacity, which EC2 answers in a 200 response."""
    return fault.error == "InsufficientInstanceCapacity" and action == "CreateFleet"


def _now() -> str:
    now = datetime.datetime.now(datetime.timezone.utc)
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"


def _reason(status: int) -> str:
    from http import HTTPStatus

    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"
