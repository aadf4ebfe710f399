"""What the SDK raises for bad input and unknown things: an unknown sandbox, an unknown
template, a bad memory quantity, a negative TTL, an unknown list filter, a wrong token, and
a webhook (not there yet); nothing is left behind by a refused claim."""
import os

from sandbox0 import APIError, Client
from sandbox0.apispec.models.sandbox_config import SandboxConfig

client = Client(token=os.environ["SANDBOX0_TOKEN"], base_url=os.environ["SANDBOX0_BASE_URL"])


def api_error(fn, status, code=None):
    try:
        fn()
    except APIError as e:
        assert e.status_code == status, (e, status)
        assert code is None or e.code == code, (e, code)
        return e
    raise AssertionError(f"expected APIError {status}")


before = {s.id for s in client.sandboxes.list(limit=200)}
e = api_error(lambda: client.sandboxes.get("sbx_nosuchsandbox"), 404, "not_found")
assert "sbx_nosuchsandbox" in e.message, e
api_error(lambda: client.sandboxes.status("sbx_nosuchsandbox"), 404, "not_found")
api_error(lambda: client.sandboxes.delete("sbx_nosuchsandbox"), 404, "not_found")
api_error(lambda: client.sandboxes.pause("sbx_nosuchsandbox"), 404, "not_found")
api_error(lambda: client.sandboxes.claim("no-such-template"), 400)
api_error(lambda: client.sandboxes.claim("default", memory="lots"), 400, "bad_request")
api_error(lambda: client.sandboxes.claim("default", memory="64Mi"), 400, "bad_request")
api_error(lambda: client.sandboxes.claim("default", config=SandboxConfig(ttl=-1)), 400, "bad_request")
api_error(lambda: client.sandboxes.claim(
    "default", config=SandboxConfig.from_dict({"webhook": {"url": "http://127.0.0.1:9/hook"}})), 501)
api_error(lambda: client.sandboxes.list(limit=0), 400, "bad_request")
try:
    client.sandboxes.list(status="sleeping")
    raise AssertionError("an unknown status was sent")
except ValueError:
    pass

bad = Client(token="not-the-token", base_url=os.environ["SANDBOX0_BASE_URL"])
api_error(lambda: bad.sandboxes.list(), 401, "unauthorized")
assert {s.id for s in client.sandboxes.list(limit=200)} == before
print("errors: ok")
