"""What a program sees when things go wrong, as Modal's own answers make the client raise it:
an unknown sandbox, exec in a terminated one, an image Belljar cannot build yet, a wrong token,
and a client version the layer does not speak (upgrade or downgrade)."""

import os

import modal
from modal.exception import AuthError, ConflictError, NotFoundError
from modal.exception import Error as ModalError


def raises(kind, fn):
    try:
        fn()
    except kind as e:
        return e
    raise AssertionError(f"expected {kind.__name__}")


app = modal.App.lookup("belljar-modal-failures", create_if_missing=True)

raises(NotFoundError, lambda: modal.Sandbox.from_id("sb-BelljarSbx000000000000"))
raises(NotFoundError, lambda: modal.Sandbox.from_id("sb-0123456789abcdefghijkl"))

sb = modal.Sandbox.create(app=app)
sb.terminate()
sb.wait(raise_on_termination=False)
e = raises(ConflictError, lambda: sb.exec("true"))
assert "finished" in str(e), e
e = raises(ConflictError, lambda: modal.Sandbox.from_id(sb.object_id).exec("true"))
assert "finished" in str(e), e

# Stdin of an entrypoint that has ended: the client turns Modal's answer into a ValueError.
sb = modal.Sandbox.create("true", app=app)
sb.wait()
sb.stdin.write(b"late\n")
raises(ValueError, sb.stdin.drain)

# What the layer does not build yet fails as a failed build does.
image = modal.Image.debian_slim().add_local_file(__file__, "/app/failures.py", copy=True)
e = raises(ModalError, lambda: modal.Sandbox.create("true", app=app, image=image))
assert "Belljar's Modal compatibility layer" in str(e), e

url = os.environ["MODAL_SERVER_URL"]
token = (os.environ["MODAL_TOKEN_ID"], os.environ["MODAL_TOKEN_SECRET"])
CLIENT = modal.client.api_pb2.CLIENT_TYPE_CLIENT


def hello(credentials, version=None):
    """The client's handshake, by a client that says it is `version`."""
    kwargs = {"version": version} if version else {}
    with modal.Client(url, CLIENT, credentials, **kwargs) as client:
        client.hello()


hello(token)
raises(AuthError, lambda: hello((token[0], "wrong")))
e = raises(ConflictError, lambda: hello(token, version="9.0.0"))
assert "downgrade" in str(e), e
e = raises(ConflictError, lambda: hello(token, version="0.73.0"))
assert "upgrade" in str(e), e
print("failures.py: ok")
