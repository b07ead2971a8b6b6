"""The k5 sweep of the service's inputs: hostile bodies, headers and AdmissionReviews, in process.

    PYTHONPATH=src python benchmarks/hostile_service_k5.py

Each case posts to an app made by `create_app` with the fake estimator; a case fails when the
answer is a 5xx, the request raises, or it takes over 20 s. Prints a markdown table.
"""

from __future__ import annotations

import io
import json
import sys
import tarfile
import time
import zipfile

from fastapi.testclient import TestClient

from peakmem.service.admission import AdmissionConfig
from peakmem.service.app import ServiceConfig, create_app
from peakmem.service.estimators import fake_estimator

JOB = {"files": {"train.py": "print('hi')\n"}, "command": ["python", "train.py"]}


def _tar(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def _info(name: str, size: int = 0, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.type, info.linkname = size, kind, link
    return info


def _zip(entries: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def _pod(annotations: object, **extra: object) -> dict:
    pod = {"metadata": {"annotations": annotations, "namespace": "ns"},
           "spec": {"containers": [{"name": "c", "image": "i"}]}}
    pod.update(extra)
    return pod


def _review(request: object) -> dict:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def cases() -> list[tuple[str, str, dict]]:
    """(name, route, requests.post kwargs)."""
    raw = {"headers": {"content-type": "application/json"}}
    out: list[tuple[str, str, dict]] = [
        ("body empty", "/v1/estimates", {"content": b"", **raw}),
        ("body not json", "/v1/estimates", {"content": b"{", **raw}),
        ("body non-utf8", "/v1/estimates", {"content": b'{"command": ["\xff"]}', **raw}),
        ("body BOM", "/v1/estimates", {"content": b"\xef\xbb\xbf" + json.dumps(JOB).encode(), **raw}),
        ("body NaN", "/v1/estimates", {"content": b'{"command": ["python", "train.py"], "options": {"timeout": NaN}}', **raw}),
        ("body Infinity", "/v1/estimates", {"content": b'{"command": ["python", "train.py"], "options": {"timeout": Infinity}}', **raw}),
        ("body huge int", "/v1/estimates", {"content": b'{"command": ["python", "train.py"], "options": {"steps": 1' + b"0" * 5000 + b"}}", **raw}),
        ("body nested", "/v1/estimates", {"content": b'{"command": ' + b"[" * 100000 + b"]" * 100000 + b"}", **raw}),
        ("body nested object", "/v1/estimates", {"content": b'{"files": ' + b'{"a":' * 50000 + b"1" + b"}" * 50001, **raw}),
        ("body duplicate keys", "/v1/estimates", {"content": b'{"command": ["x"], "command": ["python", "train.py"], "files": {"train.py": "x"}}', **raw}),
        ("body lone surrogate file name", "/v1/estimates", {"content": b'{"command": ["python", "train.py"], "files": {"\\udcff": "x", "train.py": "x"}}', **raw}),
        ("body lone surrogate content", "/v1/estimates", {"content": b'{"command": ["python", "train.py"], "files": {"train.py": "\\udcff"}}', **raw}),
        ("body NUL file name", "/v1/estimates", {"content": b'{"command": ["python", "train.py"], "files": {"a\\u0000b": "x", "train.py": "x"}}', **raw}),
        ("body list", "/v1/estimates", {"content": b"[]", **raw}),
        ("body null", "/v1/estimates", {"content": b"null", **raw}),
        ("gpu lone surrogate", "/v1/estimates", {"content": b'{"command": ["python", "train.py"], "files": {"train.py": "x"}, "gpu": "\\udcff"}', **raw}),
        ("alloc_conf lone surrogate", "/v1/estimates", {"content": b'{"command": ["python", "train.py"], "files": {"train.py": "x"}, "options": {"alloc_conf": "\\udcff"}}', **raw}),
        ("alloc_conf bad", "/v1/estimates", {"json": {**JOB, "options": {"alloc_conf": "expandable_segments:maybe"}}}),
        ("torch far future", "/v1/estimates", {"json": {**JOB, "options": {"torch": "99.0"}}}),
        ("file names many", "/v1/estimates", {"json": {**JOB, "files": {f"f{i}": "" for i in range(100000)} | JOB["files"]}}),
        ("file name long", "/v1/estimates", {"json": {**JOB, "files": {"a" * 100000: "", **JOB["files"]}}}),
        ("file name deep", "/v1/estimates", {"json": {**JOB, "files": {"a/" * 5000 + "b": "", **JOB["files"]}}}),
        ("file name dot", "/v1/estimates", {"json": {**JOB, "files": {".": "", **JOB["files"]}}}),
        ("file name empty", "/v1/estimates", {"json": {**JOB, "files": {"": "", **JOB["files"]}}}),
        ("file name backslash", "/v1/estimates", {"json": {**JOB, "files": {"..\\..\\x": "", **JOB["files"]}}}),
        ("file name trailing slash", "/v1/estimates", {"json": {**JOB, "files": {"d/": "", **JOB["files"]}}}),
        ("content-type text", "/v1/estimates", {"content": json.dumps(JOB).encode(), "headers": {"content-type": "text/plain"}}),
        ("content-type bogus charset", "/v1/estimates", {"content": json.dumps(JOB).encode(), "headers": {"content-type": "application/json; charset=zzz"}}),
        ("content-type utf-16", "/v1/estimates", {"content": json.dumps(JOB).encode("utf-16"), "headers": {"content-type": "application/json; charset=utf-16"}}),
        ("multipart no boundary", "/v1/estimates", {"content": b"--x\r\n", "headers": {"content-type": "multipart/form-data"}}),
        ("multipart garbage", "/v1/estimates", {"content": b"--x\r\nzzz", "headers": {"content-type": "multipart/form-data; boundary=x"}}),
        ("archive not archive", "/v1/estimate-archives", {"files": {"archive": ("a.tar", b"junk")}, "data": {"command": '["python", "train.py"]'}}),
        ("archive empty", "/v1/estimate-archives", {"files": {"archive": ("a.tar", b"")}, "data": {"command": '["python", "train.py"]'}}),
        ("archive tar ../", "/v1/estimate-archives", {"files": {"archive": ("a.tar", _tar([(_info("../x", 1), b"x")]))}, "data": {"command": "python x"}}),
        ("archive tar symlink", "/v1/estimate-archives", {"files": {"archive": ("a.tar", _tar([(_info("train.py", kind=tarfile.SYMTYPE, link="/etc/passwd"), None)]))}, "data": {"command": "python train.py"}}),
        ("archive tar device", "/v1/estimate-archives", {"files": {"archive": ("a.tar", _tar([(_info("train.py", kind=tarfile.CHRTYPE), None)]))}, "data": {"command": "python train.py"}}),
        ("archive tar hardlink", "/v1/estimate-archives", {"files": {"archive": ("a.tar", _tar([(_info("train.py", kind=tarfile.LNKTYPE, link="/etc/passwd"), None)]))}, "data": {"command": "python train.py"}}),
        ("archive tar huge declared", "/v1/estimate-archives", {"files": {"archive": ("a.tar", _tar([(_info("train.py", 1), b"x")])[:-1024].replace(b"00000000001", b"77777777777"))}, "data": {"command": "python train.py"}}),
        ("archive tar many", "/v1/estimate-archives", {"files": {"archive": ("a.tar", _tar([(_info(f"f{i}", 0), b"") for i in range(20000)]))}, "data": {"command": "python f1"}}),
        ("archive zip bomb", "/v1/estimate-archives", {"files": {"archive": ("a.zip", _zip({"train.py": b"\0" * (300 * 2**20)}))}, "data": {"command": "python train.py"}}),
        ("archive zip ../", "/v1/estimate-archives", {"files": {"archive": ("a.zip", _zip({"../train.py": b"x"}))}, "data": {"command": "python train.py"}}),
        ("archive zip non-utf8 content", "/v1/estimate-archives", {"files": {"archive": ("a.zip", _zip({"train.py": b"\xff\xfe"}))}, "data": {"command": "python train.py"}}),
        ("archive gzip bomb", "/v1/estimate-archives", {"files": {"archive": ("a.tar.gz", __import__("gzip").compress(b"\0" * (300 * 2**20)))}, "data": {"command": "python train.py"}}),
        ("archive command unclosed quote", "/v1/estimate-archives", {"files": {"archive": ("a.zip", _zip({"train.py": b"x"}))}, "data": {"command": "python 'train.py"}}),
        ("archive command json nested", "/v1/estimate-archives", {"files": {"archive": ("a.zip", _zip({"train.py": b"x"}))}, "data": {"command": "[" * 100000}}),
        ("archive command json not list", "/v1/estimate-archives", {"files": {"archive": ("a.zip", _zip({"train.py": b"x"}))}, "data": {"command": '[{"a": 1}]'}}),
        ("archive options list", "/v1/estimate-archives", {"files": {"archive": ("a.zip", _zip({"train.py": b"x"}))}, "data": {"command": "python train.py", "options": "[1]"}}),
        ("archive options NaN", "/v1/estimate-archives", {"files": {"archive": ("a.zip", _zip({"train.py": b"x"}))}, "data": {"command": "python train.py", "options": '{"timeout": NaN}'}}),
        ("archive options nested", "/v1/estimate-archives", {"files": {"archive": ("a.zip", _zip({"train.py": b"x"}))}, "data": {"command": "python train.py", "options": '{"a":' * 100000}}),
        ("archive command NUL", "/v1/estimate-archives", {"files": {"archive": ("a.zip", _zip({"train.py": b"x"}))}, "data": {"command": "python train.py\x00"}}),
        ("archive command lone surrogate", "/v1/estimate-archives", {"files": {"archive": ("a.zip", _zip({"train.py": b"x"}))}, "data": {"command": '["python", "\\udcff"]'}}),
        ("archive no command", "/v1/estimate-archives", {"files": {"archive": ("a.zip", _zip({"train.py": b"x"}))}}),
    ]
    for label, request in [
        ("no request", None), ("request list", []), ("uid int", {"uid": 5}),
        ("kind string", {"uid": "u", "kind": "Pod", "object": _pod({"peakmem.io/command": "python -m x"})}),
        ("kind list", {"uid": "u", "kind": [], "object": _pod({"peakmem.io/command": "python -m x"})}),
        ("operation list", {"uid": "u", "operation": [], "object": _pod({})}),
        ("namespace int", {"uid": "u", "namespace": 5, "object": _pod({"peakmem.io/command": "python -m x"})}),
        ("namespace dict", {"uid": "u", "namespace": {}, "object": {"metadata": {"namespace": {"a": 1}, "annotations": {"peakmem.io/command": "python -m x"}}, "spec": {"containers": [{}]}}}),
        ("metadata list", {"uid": "u", "object": {"metadata": [], "spec": {}}}),
        ("metadata string", {"uid": "u", "object": {"metadata": "x", "spec": {}}}),
        ("annotations list", {"uid": "u", "object": _pod([])}),
        ("annotations value int", {"uid": "u", "object": _pod({"peakmem.io/command": 5})}),
        ("annotations command nested", {"uid": "u", "object": _pod({"peakmem.io/command": "[" * 100000})}),
        ("annotations options nested", {"uid": "u", "object": _pod({"peakmem.io/command": "python -m x", "peakmem.io/options": '{"a":' * 100000})}),
        ("annotations options NaN", {"uid": "u", "object": _pod({"peakmem.io/command": "python -m x", "peakmem.io/options": '{"timeout": NaN}'})}),
        ("annotations options list", {"uid": "u", "object": _pod({"peakmem.io/command": "python -m x", "peakmem.io/options": "[1]"})}),
        ("annotations container huge", {"uid": "u", "object": _pod({"peakmem.io/command": "python -m x", "peakmem.io/container": "9" * 5000})}),
        ("annotations container negative", {"uid": "u", "object": _pod({"peakmem.io/command": "python -m x", "peakmem.io/container": "-1"})}),
        ("annotations gpu bad", {"uid": "u", "object": _pod({"peakmem.io/command": "python -m x", "peakmem.io/gpu": "../x"})}),
        ("annotations configmap bad", {"uid": "u", "object": _pod({"peakmem.io/configmap": "../../x"})}),
        ("containers not list", {"uid": "u", "object": {"metadata": {"annotations": {"peakmem.io/command": "python -m x"}}, "spec": {"containers": "x"}}}),
        ("containers empty", {"uid": "u", "object": {"metadata": {"annotations": {"peakmem.io/command": "python -m x"}}, "spec": {"containers": []}}}),
        ("container not dict", {"uid": "u", "object": {"metadata": {"annotations": {"peakmem.io/command": "python -m x"}}, "spec": {"containers": [5]}}}),
        ("container command int", {"uid": "u", "object": {"metadata": {"annotations": {"peakmem.io/configmap": "cm"}}, "spec": {"containers": [{"command": 5, "args": None}]}}}),
        ("container resources list", {"uid": "u", "object": {"metadata": {"annotations": {"peakmem.io/command": "python -m json.tool"}}, "spec": {"containers": [{"resources": []}]}}}),
        ("spec null", {"uid": "u", "object": {"metadata": {"annotations": {"peakmem.io/command": "python -m x"}}, "spec": None}}),
    ]:
        body = _review(request) if label != "no request" else {"apiVersion": "v1"}
        out.append((f"admission {label}", "/v1/admission", {"json": body}))
    out.append(("admission body list", "/v1/admission", {"json": []}))
    out.append(("admission body nested", "/v1/admission", {"content": b'{"request": ' + b"[" * 100000, **raw}))
    return out


def post_case(client, route: str, kwargs: dict) -> tuple[int | None, str, float, list[str]]:
    """POST one case: (status, body text, seconds, problems: a 5xx / no answer, over 20 s)."""
    start = time.monotonic()
    try:
        response = client.post(route, **kwargs)
        status, text = response.status_code, response.text
    except Exception as exc:  # noqa: BLE001 - the sweep records it
        status, text = None, f"{type(exc).__name__}: {exc}"
    seconds = time.monotonic() - start
    problems = []
    if status is None or status >= 500:
        problems.append(f"status {status}")
    if seconds > 20:
        problems.append(f"{seconds:.0f} s")
    return status, text, seconds, problems


def main() -> int:
    app = create_app(ServiceConfig(sandbox="off", workers=1, admission=AdmissionConfig(budget_seconds=2)),
                     estimator=fake_estimator)
    rows = []
    with TestClient(app, raise_server_exceptions=False) as client:
        for name, route, kwargs in cases():
            status, text, seconds, problems = post_case(client, route, kwargs)
            rows.append((name, route, status, round(seconds, 2), problems, " ".join(text.split())[:140]))
    print("| case | route | status | s | verdict |")
    print("| --- | --- | --- | --- | --- |")
    for name, route, status, seconds, problems, text in rows:
        verdict = "ok" if not problems else "FAIL: " + "; ".join(problems) + " -- " + text
        print(f"| {name} | {route} | {status} | {seconds} | {verdict.replace('|', '/')} |")
    print(f"\n{len(rows)} cases, {sum(1 for r in rows if r[4])} failures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
