"""Secrets: `Secret.from_dict` and named secrets made with the client's own API
(`Secret.objects.create`, looked up with `Secret.from_name`, deleted with
`Secret.objects.delete`), applied as the environment of `Sandbox.create(secrets=)` and
`exec(secrets=)`; an unknown name is the client's `NotFoundError`, a name made twice its
`AlreadyExistsError`."""

import uuid

import modal
from modal.exception import AlreadyExistsError, NotFoundError


def raises(kind, fn):
    try:
        fn()
    except kind as e:
        return e
    raise AssertionError(f"expected {kind.__name__}")


app = modal.App.lookup("belljar-modal-secrets", create_if_missing=True)
name = f"belljar-{uuid.uuid4().hex[:12]}"
modal.Secret.objects.create(name, {"API_KEY": "named-value", "SHARED": "from-name"})
e = raises(AlreadyExistsError, lambda: modal.Secret.objects.create(name, {"API_KEY": "other"}))
# allow_existing keeps the first values.
modal.Secret.objects.create(name, {"API_KEY": "other"}, allow_existing=True)

named = modal.Secret.from_name(name)
inline = modal.Secret.from_dict({"INLINE": "from-dict", "SHARED": "from-dict"})
sb = modal.Sandbox.create(
    "sh", "-c", 'echo "$API_KEY $INLINE $SHARED"', app=app, secrets=[named, inline]
)
assert sb.stdout.read() == "named-value from-dict from-dict\n"
sb.wait()

sb = modal.Sandbox.create(app=app)
try:
    p = sb.exec("sh", "-c", 'echo "${API_KEY:-unset}"')
    assert p.stdout.read() == "unset\n"
    p = sb.exec("sh", "-c", 'echo "$API_KEY $SHARED"', secrets=[modal.Secret.from_name(name)])
    assert p.stdout.read() == "named-value from-name\n"
    # A name that is not there: NotFoundError, and nothing runs.
    missing = modal.Secret.from_name(f"{name}-missing")
    raises(NotFoundError, lambda: sb.exec("true", secrets=[missing]))
    raises(
        NotFoundError,
        lambda: sb.exec("true", secrets=[modal.Secret.from_name(name, required_keys=["NOPE"])]),
    )
finally:
    sb.terminate()
raises(NotFoundError, lambda: modal.Sandbox.create(app=app, secrets=[modal.Secret.from_name(f"{name}-missing")]))

modal.Secret.objects.delete(name)
raises(NotFoundError, lambda: modal.Secret.from_name(name).hydrate())
raises(NotFoundError, lambda: modal.Secret.objects.delete(name))
modal.Secret.objects.delete(name, allow_missing=True)
print("secrets.py: ok")
