#!/usr/bin/env python3
"""Kubelet stand-in: registers a Node for every running instance of the AWS emulator.

Nothing boots in the emulator (moto), so the instances Karpenter launches never
join the cluster. This process plays their kubelet, and the part of the cloud
controller manager that deletes Nodes of terminated instances:

* every --interval seconds (default 1), DescribeInstances lists the pending and
  running instances tagged `karpenter.sh/nodepool` or `karpenter.sh/nodeclaim`
  (a NodeClaim created on its own has no NodePool) (and, unless --cluster is
  empty, tagged `kubernetes.io/cluster/<cluster>` or `eks:eks-cluster-name=<cluster>`);
* for each one without a Node (Nodes are matched by spec.providerID), it reads
  the user data (DescribeInstanceAttribute userData), extracts the node labels,
  taints and max pods per AMI family (AL2023 nodeadm NodeConfig, AL2
  bootstrap.sh --kubelet-extra-args, Bottlerocket TOML settings, Windows
  2019/2022/2025 <powershell> block calling Start-EKSBootstrap.ps1
  -KubeletExtraArgs; custom user data in any of these forms) and creates the
  Node the way kubelet and the AWS cloud provider would: name = private DNS
  name (instance id if absent or taken), providerID aws:///<zone>/<instance-id>,
  kubelet's and the cloud provider's well-known labels plus those of the user
  data, the user data's taints (Karpenter's karpenter.sh/unregistered:NoExecute
  among them), capacity and allocatable from DescribeInstanceTypes and EKS'
  default reservations, and the annotation kwok.x-k8s.io/node=fake so that
  kwok keeps it Ready and runs its pods;
* the operating system comes from the instance's image (DescribeImages of its
  ImageId, once per image: platform "windows" or not), or, when the image is
  gone, from the instance's Platform or the form of the user data (PowerShell
  is Windows; custom user data tells nothing; Linux by default). When the user
  data disagrees with the image, the image wins and a warning is logged. A
  Windows Node gets what kubelet on Windows reports: kubernetes.io/os=windows
  (and beta.kubernetes.io/os), node.kubernetes.io/windows-build from the
  image's name (Windows Server 2019 10.0.17763, 2022 10.0.20348, 2025
  10.0.26100; left out, with a warning, for an image that does not name its
  release) and status.nodeInfo.operatingSystem windows; its capacity and
  allocatable are computed as for Linux;
* a Node it created (annotation karpenter-rs.dev/kubelet-standin=<cluster>)
  whose instance is terminated, shutting down or gone is deleted. A real
  kubelet never deletes its Node: on EKS the cloud node lifecycle controller
  does, and the API server keeps the object until its finalizers (Karpenter's
  karpenter.sh/termination) are removed. Nodes it did not create are never
  deleted, nor Nodes of stopped instances.

Errors (malformed user data, API errors) are logged as one line naming the
instance and skipped; the next pass retries. Restarts are idempotent.

Run it with the emulator's venv (boto3, PyYAML); hack/standin-up.sh starts it
in the background and hack/standin-down.sh stops it:

    "$(hack/moto-up.sh --venv)/bin/python" hack/kubelet-standin.py [--once] [--cluster NAME]

Environment: KUBECONFIG (first file of the list; client certificates or
bearer token), AWS_ENDPOINT_URL, AWS_REGION and credentials (boto3's usual
chain), CLUSTER_NAME (default for --cluster).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import dataclasses
import gzip
import json
import math
import os
import re
import shlex
import signal
import ssl
import sys
import tempfile
import threading
import time
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml  # PyYAML, a pinned dependency of moto in hack/moto/requirements.txt

# --- constants -------------------------------------------------------------------------------

LABEL_NODEPOOL = "karpenter.sh/nodepool"
TAG_NODECLAIM = "karpenter.sh/nodeclaim"
TAG_EKS_CLUSTER_NAME = "eks:eks-cluster-name"
ANNOTATION_KWOK = "kwok.x-k8s.io/node"
ANNOTATION_STANDIN = "karpenter-rs.dev/kubelet-standin"
LIVE_STATES = ("pending", "running")
GONE_STATES = ("shutting-down", "terminated")
ARCH = {"x86_64": "amd64", "x86_64_mac": "amd64", "arm64": "arm64", "arm64_mac": "arm64"}
DEFAULT_MAX_PODS = 110
DEFAULT_EPHEMERAL_STORAGE = 20 * 1024**3
VM_MEMORY_OVERHEAD_PERCENT = 0.075
MI = 1024**2
GI = 1024**3
EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
LABEL_WINDOWS_BUILD = "node.kubernetes.io/windows-build"
# Windows Server release -> the build kubelet reports (major.minor.build of the kernel).
WINDOWS_BUILDS = {"2016": "10.0.14393", "2019": "10.0.17763", "2022": "10.0.20348", "2025": "10.0.26100"}


class UserDataError(ValueError):
    """User data that cannot be decoded or parsed."""


# --- logging ---------------------------------------------------------------------------------

_LOG_JSON = True


def log(level: str, msg: str, **fields: Any) -> None:
    """One line on stderr: JSON (default) or `time level msg key=value...`."""
    now = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + f".{int(time.time() * 1000) % 1000:03d}Z"
    if _LOG_JSON:
        line = json.dumps({"time": now, "level": level, "msg": msg, **fields}, default=str)
    else:
        extra = " ".join(f"{k}={v}" for k, v in fields.items())
        line = " ".join(f"{now} {level.upper()} {msg} {extra}".split())  # one line, always
    print(line, file=sys.stderr, flush=True)


# --- user data -------------------------------------------------------------------------------


@dataclass
class Taint:
    key: str
    effect: str
    value: str | None = None

    def to_k8s(self) -> dict[str, str]:
        out = {"key": self.key, "effect": self.effect}
        if self.value:
            out["value"] = self.value
        return out


@dataclass
class Bootstrap:
    """What a node's user data tells its kubelet."""

    family: str  # AL2023, AL2, Bottlerocket, Windows or Custom
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[Taint] = field(default_factory=list)
    max_pods: int | None = None

    def merge(self, other: Bootstrap) -> None:
        """Applies a later configuration over this one (labels merge, taints add, max pods wins)."""
        self.labels.update(other.labels)
        for t in other.taints:
            if t not in self.taints:
                self.taints.append(t)
        if other.max_pods is not None:
            self.max_pods = other.max_pods


def decode_user_data(value: str | None) -> str:
    """The text of base64 user data (gzip-compressed user data is inflated)."""
    if not value:
        return ""
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise UserDataError(f"user data is not base64: {exc}") from exc
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise UserDataError(f"user data is not valid gzip: {exc}") from exc
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserDataError(f"user data is not UTF-8 text: {exc}") from exc


def parse_taint(text: str) -> Taint:
    """`key=value:Effect`, `key=:Effect` or `key:Effect`."""
    spec, sep, effect = text.strip().rpartition(":")
    if not sep or effect not in EFFECTS or not spec:
        raise UserDataError(f"bad taint {text!r}")
    key, _, value = spec.partition("=")
    if not key:
        raise UserDataError(f"bad taint {text!r}")
    return Taint(key=key, effect=effect, value=value or None)


def parse_labels(text: str) -> dict[str, str]:
    """`k1=v1,k2=v2` (kubelet's --node-labels)."""
    labels: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserDataError(f"bad node label {item!r}")
        labels[key] = value
    return labels


def parse_kubelet_flags(args: list[str], family: str) -> Bootstrap:
    """--node-labels, --register-with-taints and --max-pods among kubelet flags."""
    out = Bootstrap(family=family)
    i = 0
    while i < len(args):
        name, eq, value = args[i].partition("=")
        if not eq and i + 1 < len(args) and name in ("--node-labels", "--register-with-taints", "--max-pods"):
            value = args[i + 1]
            i += 1
        if name == "--node-labels":
            out.labels.update(parse_labels(value))
        elif name == "--register-with-taints":
            out.taints.extend(parse_taint(t) for t in value.split(",") if t.strip())
        elif name == "--max-pods":
            out.max_pods = _int(value, "--max-pods")
        i += 1
    return out


def _int(value: Any, what: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError) as exc:
        raise UserDataError(f"{what} is not an integer: {value!r}") from exc


def mime_parts(text: str) -> list[tuple[str, str]] | None:
    """(content type, body) of each part of a MIME multi-part document; None if `text` is not one."""
    text = text.replace("\r\n", "\n")
    head, sep, rest = text.partition("\n\n")
    if not sep or not any(line.lower().startswith("mime-version:") for line in head.splitlines()):
        return None
    match = re.search(r'boundary="?([^";\n]+)"?', head)
    if not match:
        raise UserDataError("MIME user data without a boundary")
    parts = []
    for chunk in rest.split(f"--{match.group(1)}")[1:]:
        if chunk.startswith("--"):
            break
        part_head, _, body = chunk.lstrip("\n").partition("\n\n")
        ctype = "text/x-shellscript"
        for line in part_head.splitlines():
            key, _, value = line.partition(":")
            if key.strip().lower() == "content-type":
                ctype = value.strip()
        parts.append((ctype, body.strip("\n")))
    return parts


def parse_node_config(text: str) -> Bootstrap:
    """A nodeadm NodeConfig (YAML): kubelet.config maxPods / registerWithTaints and kubelet.flags."""
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise UserDataError(f"NodeConfig is not valid YAML: {exc}") from exc
    out = Bootstrap(family="AL2023")
    for doc in docs:
        if not isinstance(doc, dict) or doc.get("kind") != "NodeConfig":
            raise UserDataError("YAML part is not a NodeConfig")
        kubelet = (doc.get("spec") or {}).get("kubelet") or {}
        config = kubelet.get("config") or {}
        flags = kubelet.get("flags") or []
        if not isinstance(config, dict) or not isinstance(flags, list):
            raise UserDataError("NodeConfig spec.kubelet has an unexpected shape")
        # Flag values may be quoted (--node-labels="k=v,..."), as systemd unquotes them.
        try:
            words = [w for f in flags for w in shlex.split(str(f))]
        except ValueError as exc:
            raise UserDataError(f"cannot split the NodeConfig kubelet flags: {exc}") from exc
        part = parse_kubelet_flags(words, "AL2023")
        for t in config.get("registerWithTaints") or []:
            if not isinstance(t, dict) or not t.get("key") or t.get("effect") not in EFFECTS:
                raise UserDataError(f"bad registerWithTaints entry {t!r}")
            part.taints.append(Taint(key=str(t["key"]), effect=t["effect"], value=t.get("value") or None))
        if config.get("maxPods") is not None:
            part.max_pods = _int(config["maxPods"], "maxPods")
        out.merge(part)
    return out


def parse_bootstrap_script(text: str) -> Bootstrap | None:
    """The kubelet flags of an AL2 script's /etc/eks/bootstrap.sh call; None without such a call."""
    joined = text.replace("\\\n", " ")
    for line in joined.splitlines():
        if "/etc/eks/bootstrap.sh" not in line:
            continue
        try:
            words = shlex.split(line, comments=True)
        except ValueError as exc:
            raise UserDataError(f"cannot split the bootstrap.sh line: {exc}") from exc
        extra = ""
        for i, word in enumerate(words):
            if word == "--kubelet-extra-args" and i + 1 < len(words):
                extra = words[i + 1]
            elif word.startswith("--kubelet-extra-args="):
                extra = word.partition("=")[2]
        try:
            return parse_kubelet_flags(shlex.split(extra), "AL2")
        except ValueError as exc:
            raise UserDataError(f"cannot split --kubelet-extra-args: {exc}") from exc
    return None


def parse_bottlerocket(text: str) -> Bootstrap | None:
    """Bottlerocket settings (TOML); None when `text` is not TOML with [settings]."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return None
    settings = doc.get("settings")
    if not isinstance(settings, dict):
        return None
    k8s = settings.get("kubernetes") or {}
    out = Bootstrap(family="Bottlerocket")
    labels = k8s.get("node-labels") or {}
    if not isinstance(labels, dict):
        raise UserDataError("settings.kubernetes.node-labels is not a table")
    out.labels = {str(k): str(v) for k, v in labels.items()}
    taints = k8s.get("node-taints") or {}
    if not isinstance(taints, dict):
        raise UserDataError("settings.kubernetes.node-taints is not a table")
    for key, values in taints.items():
        for v in [values] if isinstance(values, str) else values:
            value, sep, effect = str(v).rpartition(":")
            if not sep or effect not in EFFECTS:
                raise UserDataError(f"bad node-taints entry {key} = {v!r}")
            out.taints.append(Taint(key=str(key), effect=effect, value=value or None))
    if k8s.get("max-pods") is not None:
        out.max_pods = _int(k8s["max-pods"], "max-pods")
    return out


POWERSHELL_OPEN = re.compile(r"<powershell>", re.IGNORECASE)
POWERSHELL_CLOSE = re.compile(r"</powershell>", re.IGNORECASE)
# A statement that runs the EKS bootstrap script: `& $EKSBootstrapScriptFile ...` as Karpenter
# writes it, the script's path after the call (&) or dot-source (.) operator, or its bare path.
# A variable or a quoted path without an operator is an expression (an assignment, say), no call.
EKS_BOOTSTRAP_CALL = re.compile(
    r"""^\s*(?:(?:&\s*|\.\s+)(?:\$EKSBootstrapScriptFile\b|'[^']*Start-EKSBootstrap\.ps1'"""
    r"""|"[^"]*Start-EKSBootstrap\.ps1"|[^\s'"]*Start-EKSBootstrap\.ps1\b)"""
    r"""|[^\s'"$&]*Start-EKSBootstrap\.ps1(?:\s|$))""",
    re.IGNORECASE,
)


# Start-EKSBootstrap.ps1's parameters that take a value (lower case: PowerShell ignores case).
EKS_BOOTSTRAP_VALUE_PARAMETERS = {
    "eksclustername", "apiserverendpoint", "base64clusterca", "dnsclusterip", "kubeletextraargs",
    "kubeproxyextraargs", "containerruntime", "servicecidr", "excludedsnatcidrs",
}


@dataclass
class PSToken:
    """A word of a PowerShell command line, quotes removed; `parameter` for an unquoted `-Name`."""

    text: str
    parameter: bool = False


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0"}


def _quoted(line: str, i: int, text: list[str]) -> int:
    """Reads the PowerShell string that opens at line[i] into `text`; the index after it.

    In both kinds a doubled quote is one quote; a double-quoted string also takes backtick
    escapes (`n, `t, ...)."""
    quote, n = line[i], len(line)
    kind = "single" if quote == "'" else "double"
    i += 1
    while True:
        if i >= n:
            raise UserDataError(f"unterminated {kind}-quoted string in {line.strip()!r}")
        c = line[i]
        if c == quote:
            if i + 1 < n and line[i + 1] == quote:
                text.append(quote)
                i += 2
                continue
            return i + 1
        if quote == '"' and c == "`" and i + 1 < n:
            text.append(_ESCAPES.get(line[i + 1], line[i + 1]))
            i += 2
            continue
        text.append(c)
        i += 1


def powershell_words(line: str) -> list[PSToken]:
    """The words of the first statement of one PowerShell line (command argument mode).

    Single-quoted strings ('' is a quote), double-quoted strings (`x and "" escapes; variables
    are not expanded) and bare words (`x escapes); the statement ends at an unquoted `;` or `|`,
    or a comment (`#` starting a word).
    """
    words: list[PSToken] = []
    i, n = 0, len(line)
    while i < n:
        while i < n and line[i] in " \t":
            i += 1
        if i >= n or line[i] in ";|#":
            break
        parameter = line[i] == "-" and i + 1 < n and (line[i + 1].isalpha() or line[i + 1] == "_")
        text: list[str] = []
        while i < n and line[i] not in " \t;|":
            c = line[i]
            if c in "'\"":
                i = _quoted(line, i, text)
            elif c == "`" and i + 1 < n:
                text.append(line[i + 1])
                i += 2
            else:
                text.append(c)
                i += 1
        words.append(PSToken("".join(text), parameter))
    return words


def parse_eks_bootstrap_call(line: str) -> Bootstrap:
    """The kubelet flags of one Start-EKSBootstrap.ps1 call (its -KubeletExtraArgs)."""
    words = powershell_words(line)
    if words and words[0].text in ("&", "."):
        words = words[1:]
    values: dict[str, str] = {}
    i = 1  # words[0] is the script
    while i < len(words):
        word = words[i]
        i += 1
        if not word.parameter:
            continue  # a positional argument: nothing the node's registration depends on
        name, colon, value = word.text[1:].partition(":")  # -Name:value binds its value
        key = name.lower()
        if not value:  # -Name value (or -Name: value)
            if i < len(words) and not words[i].parameter:
                value = words[i].text
                i += 1
            elif not colon and key in EKS_BOOTSTRAP_VALUE_PARAMETERS:
                raise UserDataError(f"the Start-EKSBootstrap.ps1 parameter -{name} has no value")
            # else a switch (-Verbose, say)
        if key in values:
            raise UserDataError(f"the Start-EKSBootstrap.ps1 parameter -{name} is given twice")
        values[key] = value
    if not values.get("eksclustername"):
        raise UserDataError("the Start-EKSBootstrap.ps1 call has no -EKSClusterName")
    try:
        flags = shlex.split(values.get("kubeletextraargs", ""))
    except ValueError as exc:
        raise UserDataError(f"cannot split -KubeletExtraArgs: {exc}") from exc
    return parse_kubelet_flags(flags, "Windows")


def parse_windows(text: str) -> Bootstrap | None:
    """Windows user data: the kubelet flags of the EKS bootstrap call in its <powershell> block.

    None when `text` has no <powershell> block. The block may start with the class's own
    PowerShell (only a statement that calls the script counts, not one that mentions it); when
    it calls the script more than once, the last call counts, as it configures the kubelet
    last. A block without a call is Windows user data that passes the kubelet nothing.
    """
    opening = POWERSHELL_OPEN.search(text)
    if opening is None:
        return None
    closings = list(POWERSHELL_CLOSE.finditer(text, opening.end()))
    if not closings:
        raise UserDataError("<powershell> block without </powershell>")
    body = text[opening.end():closings[-1].start()]
    # A backtick at the end of a line continues the statement on the next one.
    body = re.sub(r"`[ \t]*\r?\n", " ", body)
    out = Bootstrap(family="Windows")
    for line in body.splitlines():
        if EKS_BOOTSTRAP_CALL.match(line):
            out = parse_eks_bootstrap_call(line)
    return out


def parse_user_data(text: str) -> Bootstrap:
    """Labels, taints and max pods of user data in any of the forms Karpenter writes or passes on."""
    parts = mime_parts(text)
    if parts is not None:
        return _parse_mime(parts)
    stripped = text.lstrip()
    if not stripped:
        return Bootstrap(family="Custom")
    if stripped.startswith("#!"):
        return parse_bootstrap_script(text) or Bootstrap(family="Custom")
    windows = parse_windows(text)
    if windows is not None:
        return windows
    if re.search(r"^\s*kind:\s*NodeConfig\s*$", text, re.MULTILINE):
        return parse_node_config(text)
    bottlerocket = parse_bottlerocket(text)
    if bottlerocket is not None:
        return bottlerocket
    if stripped.startswith("["):
        raise UserDataError("user data looks like TOML but does not parse")
    return Bootstrap(family="Custom")


def _parse_mime(parts: list[tuple[str, str]]) -> Bootstrap:
    out: Bootstrap | None = None
    for ctype, body in parts:
        part: Bootstrap | None = None
        if ctype.startswith("application/node.eks.aws"):
            part = parse_node_config(body)
        elif ctype.startswith("text/x-shellscript"):
            part = parse_bootstrap_script(body)
        if part is None:
            continue
        if out is None:
            out = part
        else:
            out.merge(part)
    return out or Bootstrap(family="Custom")


# --- capacity --------------------------------------------------------------------------------


@dataclass(frozen=True)
class TypeInfo:
    """What the Node's capacity depends on, from DescribeInstanceTypes."""

    name: str
    vcpus: int
    memory_mib: int
    architectures: tuple[str, ...] = ()
    max_enis: int = 0
    ipv4_per_eni: int = 0
    gpus: tuple[tuple[str, int], ...] = ()

    @classmethod
    def from_api(cls, t: dict[str, Any]) -> TypeInfo:
        net = t.get("NetworkInfo") or {}
        gpus = tuple(
            (str(g.get("Manufacturer", "")), int(g.get("Count", 0)))
            for g in (t.get("GpuInfo") or {}).get("Gpus") or []
        )
        return cls(
            name=t["InstanceType"],
            vcpus=int(t["VCpuInfo"]["DefaultVCpus"]),
            memory_mib=int(t["MemoryInfo"]["SizeInMiB"]),
            architectures=tuple((t.get("ProcessorInfo") or {}).get("SupportedArchitectures") or ()),
            max_enis=int(net.get("MaximumNetworkInterfaces") or 0),
            ipv4_per_eni=int(net.get("Ipv4AddressesPerInterface") or 0),
            gpus=gpus,
        )


def eni_limited_pods(info: TypeInfo) -> int:
    """ENIs × (IPv4 addresses per ENI − 1) + 2 (VPC CNI without prefix delegation)."""
    if info.max_enis <= 0 or info.ipv4_per_eni <= 0:
        return DEFAULT_MAX_PODS
    return info.max_enis * (info.ipv4_per_eni - 1) + 2


def kube_reserved_cpu_millis(cpu_millis: int) -> int:
    """EKS' kube-reserved CPU: 6% of the first core, 1% of the second, 0.5% up to 4, 0.25% beyond."""
    ranges = ((0, 1000, 0.06), (1000, 2000, 0.01), (2000, 4000, 0.005), (4000, 1 << 62, 0.0025))
    return sum(int(max(min(cpu_millis, end) - start, 0) * share) for start, end, share in ranges)


def node_resources(
    info: TypeInfo, max_pods: int | None, ephemeral_storage: int = DEFAULT_EPHEMERAL_STORAGE
) -> tuple[dict[str, str], dict[str, str]]:
    """Capacity and allocatable, with the reservations nodeadm/bootstrap.sh configure by default."""
    pods = max_pods if max_pods is not None else eni_limited_pods(info)
    cpu = info.vcpus * 1000
    # Graviton types keep 64 MiB for the contiguous memory allocator.
    mib = info.memory_mib - (64 if info.architectures[:1] == ("arm64",) else 0)
    memory = (mib - math.ceil(mib * VM_MEMORY_OVERHEAD_PERCENT)) * MI
    capacity = {
        "cpu": str(info.vcpus),
        "memory": f"{memory // 1024}Ki",
        "ephemeral-storage": str(ephemeral_storage),
        "pods": str(pods),
        "hugepages-1Gi": "0",
        "hugepages-2Mi": "0",
    }
    for manufacturer, count in info.gpus:
        resource = {"nvidia": "nvidia.com/gpu", "amd": "amd.com/gpu"}.get(manufacturer.lower())
        if resource and count > 0:
            capacity[resource] = str(int(capacity.get(resource, "0")) + count)
    allocatable = dict(capacity)
    allocatable["cpu"] = f"{cpu - kube_reserved_cpu_millis(cpu)}m"
    # kube-reserved (sized for the ENI-limited pod count, whatever max-pods says) + eviction threshold
    reserved_memory = (11 * eni_limited_pods(info) + 255) * MI + 100 * MI
    allocatable["memory"] = f"{max(memory - reserved_memory, 0) // 1024}Ki"
    reserved_storage = GI + math.ceil(ephemeral_storage * 0.1)  # kube-reserved + nodefs.available
    allocatable["ephemeral-storage"] = str(max(ephemeral_storage - reserved_storage, 0))
    return capacity, allocatable


# --- operating system ------------------------------------------------------------------------


@dataclass(frozen=True)
class ImageInfo:
    """What the Node's operating system depends on, from DescribeImages."""

    image_id: str
    name: str = ""
    windows: bool = False
    windows_build: str | None = None  # None for Linux, or a Windows image of an unknown release

    @classmethod
    def from_api(cls, image: dict[str, Any]) -> ImageInfo:
        platform = str(image.get("Platform") or "").lower()
        windows = platform == "windows" or str(image.get("PlatformDetails") or "").startswith("Windows")
        name = str(image.get("Name") or "")
        build = None
        if windows:
            build = windows_build(name) or windows_build(str(image.get("Description") or ""))
        return cls(image_id=str(image.get("ImageId") or ""), name=name, windows=windows, windows_build=build)


def windows_build(text: str) -> str | None:
    """The build of the Windows Server release an image name (or description) names, e.g.
    Windows_Server-2022-English-Core-EKS_Optimized-1.34-2025.11.12 -> 10.0.20348."""
    match = re.search(r"Windows[_ -]Server[_ -](\d{4})(?!\d)", text, re.IGNORECASE)
    return WINDOWS_BUILDS.get(match.group(1)) if match else None


@dataclass(frozen=True)
class NodeOS:
    """The operating system kubelet reports: `linux`, or `windows` with its build."""

    name: str = "linux"
    windows_build: str | None = None


LINUX = NodeOS()
USER_DATA_OS = {"AL2023": "linux", "AL2": "linux", "Bottlerocket": "linux", "Windows": "windows"}


def decide_os(boot: Bootstrap, image: ImageInfo | None, instance: dict[str, Any]) -> tuple[NodeOS, list[str]]:
    """The node's operating system, and notes worth logging.

    The image tells (its platform), else the instance (EC2 reports Platform windows for Windows
    instances, nothing for Linux ones), else the form of the user data (custom user data tells
    nothing), else Linux. When the user data disagrees with the image, the image wins.
    """
    notes: list[str] = []
    told = USER_DATA_OS.get(boot.family)
    if image is not None:
        os_name, source = ("windows" if image.windows else "linux"), f"image {image.image_id}"
    elif str(instance.get("Platform") or "").lower() == "windows":
        os_name, source = "windows", "instance platform"
    else:
        os_name, source = (told or "linux"), "user data"
    if told and told != os_name:
        notes.append(f"{boot.family} user data on a {os_name} {source}: the node runs {os_name}")
    if os_name != "windows":
        return LINUX, notes
    build = image.windows_build if image is not None else None
    if build is None:
        what = f"image {image.name or image.image_id}" if image is not None else "image (not found)"
        notes.append(f"unknown Windows build of the {what}: no {LABEL_WINDOWS_BUILD} label")
    return NodeOS("windows", build), notes


# --- the Node --------------------------------------------------------------------------------


def provider_id(instance: dict[str, Any]) -> str:
    return f"aws:///{instance['Placement']['AvailabilityZone']}/{instance['InstanceId']}"


def instance_id_of(provider: str) -> str | None:
    """The instance id of an `aws:///<zone>/<id>` provider ID."""
    match = re.fullmatch(r"aws:///[^/]*/(i-[0-9a-zA-Z]+)", provider or "")
    return match.group(1) if match else None


def instance_tags(instance: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t.get("Value", "") for t in instance.get("Tags") or []}


def in_cluster(instance: dict[str, Any], cluster: str) -> bool:
    """Tagged for `cluster` (any cluster when `cluster` is empty)."""
    if not cluster:
        return True
    tags = instance_tags(instance)
    return f"kubernetes.io/cluster/{cluster}" in tags or tags.get(TAG_EKS_CLUSTER_NAME) == cluster


def well_known_labels(
    instance: dict[str, Any],
    info: TypeInfo | None,
    name: str,
    region: str,
    zone_id: str | None,
    node_os: NodeOS = LINUX,
) -> dict[str, str]:
    """What kubelet and the AWS cloud provider label a node with."""
    zone = instance["Placement"]["AvailabilityZone"]
    arch_name = instance.get("Architecture") or (info.architectures[0] if info and info.architectures else "x86_64")
    arch = ARCH.get(arch_name, arch_name)
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": node_os.name,
        "kubernetes.io/arch": arch,
        "beta.kubernetes.io/os": node_os.name,
        "beta.kubernetes.io/arch": arch,
        "node.kubernetes.io/instance-type": instance["InstanceType"],
        "beta.kubernetes.io/instance-type": instance["InstanceType"],
        "topology.kubernetes.io/zone": zone,
        "topology.kubernetes.io/region": region,
        "failure-domain.beta.kubernetes.io/zone": zone,
        "failure-domain.beta.kubernetes.io/region": region,
    }
    if zone_id:
        labels["topology.k8s.aws/zone-id"] = zone_id
    if node_os.windows_build:
        labels[LABEL_WINDOWS_BUILD] = node_os.windows_build  # kubelet on Windows sets it
    return labels


def build_node(
    instance: dict[str, Any],
    boot: Bootstrap,
    info: TypeInfo,
    name: str,
    cluster: str,
    region: str,
    zone_id: str | None = None,
    ephemeral_storage: int = DEFAULT_EPHEMERAL_STORAGE,
    node_os: NodeOS = LINUX,
) -> dict[str, Any]:
    """The Node object kubelet would register for `instance`."""
    labels = well_known_labels(instance, info, name, region, zone_id, node_os)
    labels.update(boot.labels)
    capacity, allocatable = node_resources(info, boot.max_pods, ephemeral_storage)
    addresses = []
    if instance.get("PrivateIpAddress"):
        addresses.append({"type": "InternalIP", "address": instance["PrivateIpAddress"]})
    if instance.get("PrivateDnsName"):
        addresses.append({"type": "InternalDNS", "address": instance["PrivateDnsName"]})
    addresses.append({"type": "Hostname", "address": name})
    spec: dict[str, Any] = {"providerID": provider_id(instance)}
    if boot.taints:
        spec["taints"] = [t.to_k8s() for t in boot.taints]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {
                ANNOTATION_KWOK: "fake",
                ANNOTATION_STANDIN: cluster,
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
        },
        "spec": spec,
        "status": {
            "capacity": capacity,
            "allocatable": allocatable,
            "addresses": addresses,
            "nodeInfo": {"architecture": labels["kubernetes.io/arch"], "operatingSystem": node_os.name},
        },
    }


# --- Kubernetes API --------------------------------------------------------------------------


class KubeError(RuntimeError):
    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class Kube:
    """A minimal client of the API server, configured from a kubeconfig."""

    def __init__(self, server: str, context: ssl.SSLContext | None, token: str | None):
        self.server = server.rstrip("/")
        self.token = token
        handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
        if context is not None:
            handlers.append(urllib.request.HTTPSHandler(context=context))
        self.opener = urllib.request.build_opener(*handlers)

    @classmethod
    def from_kubeconfig(cls, path: str | None = None) -> Kube:
        path = path or (os.environ.get("KUBECONFIG") or "").split(os.pathsep)[0] or str(
            Path.home() / ".kube" / "config"
        )
        config = yaml.safe_load(Path(path).read_text())
        ctx_name = config.get("current-context")
        ctx = _named(config.get("contexts"), ctx_name, "context")
        cluster = _named(config.get("clusters"), ctx.get("cluster"), "cluster")
        user = _named(config.get("users"), ctx.get("user"), "user") if ctx.get("user") else {}
        server = cluster["server"]
        context = None
        if server.startswith("https:"):
            context = _ssl_context(cluster, user, Path(path).parent)
        token = user.get("token")
        if not token and user.get("tokenFile"):
            token = Path(user["tokenFile"]).read_text().strip()
        return cls(server, context, token)

    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with self.opener.open(req, timeout=30) as resp:
                return json.load(resp)
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            try:
                detail = json.loads(detail).get("message", detail)
            except ValueError:
                pass
            raise KubeError(exc.code, detail) from None

    def list_nodes(self) -> list[dict[str, Any]]:
        return self.request("GET", "/api/v1/nodes")["items"]

    def create_node(self, node: dict[str, Any]) -> dict[str, Any]:
        return self.request("POST", "/api/v1/nodes", node)

    def delete_node(self, name: str) -> None:
        self.request("DELETE", f"/api/v1/nodes/{urllib.parse.quote(name, safe='')}")


def _named(items: list[dict[str, Any]] | None, name: str | None, kind: str) -> dict[str, Any]:
    for item in items or []:
        if item.get("name") == name:
            return item.get(kind) or {}
    raise ValueError(f"kubeconfig has no {kind} named {name!r}")


def _ssl_context(cluster: dict[str, Any], user: dict[str, Any], base: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    if cluster.get("insecure-skip-tls-verify"):
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif cluster.get("certificate-authority-data"):
        ctx.load_verify_locations(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
    elif cluster.get("certificate-authority"):
        ctx.load_verify_locations(cafile=str(base / cluster["certificate-authority"]))
    cert, key = user.get("client-certificate-data"), user.get("client-key-data")
    if cert and key:
        # ssl loads client certificates from files only: a private directory, removed at once.
        with tempfile.TemporaryDirectory(prefix="kubelet-standin-") as tmp:
            cert_file, key_file = Path(tmp, "cert.pem"), Path(tmp, "key.pem")
            cert_file.write_bytes(base64.b64decode(cert))
            key_file.touch(mode=0o600)
            key_file.write_bytes(base64.b64decode(key))
            ctx.load_cert_chain(str(cert_file), str(key_file))
    elif user.get("client-certificate") and user.get("client-key"):
        ctx.load_cert_chain(str(base / user["client-certificate"]), str(base / user["client-key"]))
    return ctx


# --- reconciliation --------------------------------------------------------------------------


@dataclass
class Options:
    cluster: str = ""
    region: str = "us-west-2"
    ephemeral_storage: int = DEFAULT_EPHEMERAL_STORAGE
    delete_nodes: bool = True


@dataclass
class PassResult:
    created: list[str] = field(default_factory=list)  # Node names
    deleted: list[str] = field(default_factory=list)  # Node names
    errors: list[str] = field(default_factory=list)  # instance ids (or node names)


class StandIn:
    """One reconcile pass at a time: Nodes for live instances, no Nodes for gone ones."""

    def __init__(self, ec2: Any, kube: Kube, options: Options):
        self.ec2 = ec2
        self.kube = kube
        self.options = options
        self._types: dict[str, TypeInfo] = {}
        self._images: dict[str, ImageInfo | None] = {}
        self._zone_ids: dict[str, str] | None = None
        self._reported: dict[str, str] = {}

    def reconcile(self) -> PassResult:
        result = PassResult()
        instances = self.live_instances()
        nodes = self.kube.list_nodes()
        by_provider = {n["spec"].get("providerID"): n for n in nodes if n.get("spec", {}).get("providerID")}
        names = {n["metadata"]["name"] for n in nodes}
        for instance in instances:
            if provider_id(instance) in by_provider:
                continue
            self._guard(result, instance["InstanceId"], lambda i=instance: self.register(i, names, result))
        if self.options.delete_nodes:
            live = {i["InstanceId"] for i in instances}
            for node in nodes:
                self._guard(result, node["metadata"]["name"], lambda n=node: self.collect(n, live, result))
        return result

    def _guard(self, result: PassResult, what: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as exc:  # one bad instance or node never stops the others
            result.errors.append(what)
            message = f"skipped: {type(exc).__name__}: {exc}"
            if self._reported.get(what) != message:  # once per instance and error, not every pass
                self._reported[what] = message
                key = "instance" if what.startswith("i-") else "node"
                log("error", message, **{key: what})
        else:
            self._reported.pop(what, None)

    def live_instances(self) -> list[dict[str, Any]]:
        filters = [
            {"Name": "instance-state-name", "Values": list(LIVE_STATES)},
            {"Name": "tag-key", "Values": [LABEL_NODEPOOL, TAG_NODECLAIM]},
        ]
        out = []
        for page in self.ec2.get_paginator("describe_instances").paginate(Filters=filters):
            for reservation in page["Reservations"]:
                out.extend(i for i in reservation["Instances"] if in_cluster(i, self.options.cluster))
        return out

    def register(self, instance: dict[str, Any], names: set[str], result: PassResult) -> None:
        iid = instance["InstanceId"]
        attr = self.ec2.describe_instance_attribute(InstanceId=iid, Attribute="userData")
        boot = parse_user_data(decode_user_data((attr.get("UserData") or {}).get("Value")))
        image = self.image_info(instance["ImageId"]) if instance.get("ImageId") else None
        node_os, notes = decide_os(boot, image, instance)
        for note in notes:
            log("warning", note, instance=iid, image=instance.get("ImageId"))
        name = instance.get("PrivateDnsName") or iid
        if name in names:
            log("info", "node name taken by another instance's Node: using the instance id", instance=iid, name=name)
            name = iid
        node = build_node(
            instance,
            boot,
            self.type_info(instance["InstanceType"]),
            name,
            self.options.cluster,
            self.options.region,
            self.zone_id(instance["Placement"]["AvailabilityZone"]),
            self.options.ephemeral_storage,
            node_os,
        )
        self.kube.create_node(node)
        names.add(name)
        result.created.append(name)
        log(
            "info",
            "registered node",
            instance=iid,
            node=name,
            family=boot.family,
            os=node_os.name,
            taints=len(boot.taints),
            pods=node["status"]["capacity"]["pods"],
        )

    def collect(self, node: dict[str, Any], live: set[str], result: PassResult) -> None:
        meta = node["metadata"]
        if (meta.get("annotations") or {}).get(ANNOTATION_STANDIN) != self.options.cluster:
            return
        if meta.get("deletionTimestamp"):
            return
        iid = instance_id_of(node.get("spec", {}).get("providerID", ""))
        if not iid or iid in live or not self.instance_gone(iid):
            return
        try:
            self.kube.delete_node(meta["name"])
        except KubeError as exc:
            if exc.status != 404:
                raise
        result.deleted.append(meta["name"])
        log("info", "deleted node of a terminated instance", instance=iid, node=meta["name"])

    def instance_gone(self, iid: str) -> bool:
        try:
            reservations = self.ec2.describe_instances(InstanceIds=[iid])["Reservations"]
        except Exception as exc:
            if "InvalidInstanceID" in str(getattr(exc, "response", {}).get("Error", {}).get("Code", "")):
                return True
            raise
        states = [i["State"]["Name"] for r in reservations for i in r["Instances"]]
        return not states or all(s in GONE_STATES for s in states)

    def type_info(self, name: str) -> TypeInfo:
        if name not in self._types:
            types = self.ec2.describe_instance_types(InstanceTypes=[name])["InstanceTypes"]
            if not types:
                raise LookupError(f"instance type {name} not found")
            self._types[name] = TypeInfo.from_api(types[0])
        return self._types[name]

    def image_info(self, image_id: str) -> ImageInfo | None:
        """The instance's image (cached per image id); None when the image no longer exists."""
        if image_id not in self._images:
            try:
                images = self.ec2.describe_images(ImageIds=[image_id])["Images"]
            except Exception as exc:
                if "InvalidAMIID" not in str(getattr(exc, "response", {}).get("Error", {}).get("Code", "")):
                    raise
                images = []
            self._images[image_id] = ImageInfo.from_api(images[0]) if images else None
        return self._images[image_id]

    def zone_id(self, zone: str) -> str | None:
        if self._zone_ids is None:
            zones = self.ec2.describe_availability_zones()["AvailabilityZones"]
            self._zone_ids = {z["ZoneName"]: z.get("ZoneId", "") for z in zones}
        return self._zone_ids.get(zone) or None


# --- main ------------------------------------------------------------------------------------


def ec2_client(region: str) -> Any:
    import boto3
    from botocore.config import Config

    cfg = Config(retries={"max_attempts": 2}, connect_timeout=5, read_timeout=30)
    return boto3.session.Session(region_name=region).client("ec2", config=cfg)


def parse_quantity_bytes(text: str) -> int:
    units = {"": 1, "k": 1000, "M": 1000**2, "G": 1000**3, "T": 1000**4, "Ki": 1024, "Mi": MI, "Gi": GI, "Ti": 1024**4}
    match = re.fullmatch(r"(\d+)([KMGT]i|[kMGT])?", text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"not a quantity: {text!r}")
    return int(match.group(1)) * units[match.group(2) or ""]


def main(argv: list[str] | None = None) -> int:
    global _LOG_JSON
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--cluster", default=os.environ.get("CLUSTER_NAME", "karpenter-demo"),
                        help="only instances tagged for this cluster ('' for all); default $CLUSTER_NAME")
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-west-2"
    parser.add_argument("--region", default=region)
    parser.add_argument("--kubeconfig", default=None, help="default: first file of $KUBECONFIG")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between passes (default 1)")
    parser.add_argument("--once", action="store_true", help="one pass, then exit (status 1 on errors)")
    parser.add_argument("--ephemeral-storage", type=parse_quantity_bytes, default=DEFAULT_EPHEMERAL_STORAGE,
                        help="ephemeral-storage capacity of every Node (default 20Gi)")
    parser.add_argument("--no-delete", action="store_true", help="never delete Nodes of terminated instances")
    parser.add_argument("--log-format", choices=("json", "text"), default="json")
    args = parser.parse_args(argv)
    _LOG_JSON = args.log_format == "json"

    options = Options(cluster=args.cluster, region=args.region, ephemeral_storage=args.ephemeral_storage,
                      delete_nodes=not args.no_delete)
    try:
        standin = StandIn(ec2_client(args.region), Kube.from_kubeconfig(args.kubeconfig), options)
    except Exception as exc:  # a configuration error: nothing to retry
        log("error", f"cannot start: {type(exc).__name__}: {exc}")
        return 2
    log("info", "kubelet stand-in started", **dataclasses.asdict(options), interval=args.interval)
    if args.once:
        return 1 if standin.reconcile().errors else 0

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: stop.set())
    failure = ""
    while not stop.is_set():
        try:
            standin.reconcile()
        except Exception as exc:  # the API server or the emulator is down: try again later
            message = f"pass failed: {type(exc).__name__}: {exc}"
            if message != failure:  # once, not every pass
                log("error", message)
            failure = message
        else:
            if failure:
                log("info", "passes succeed again")
            failure = ""
        stop.wait(args.interval)
    log("info", "kubelet stand-in stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
