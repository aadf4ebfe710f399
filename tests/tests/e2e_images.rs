//! What the images promise their users, checked in a real sandbox: on `python3.13`,
//! `pip install` works as it does on the cloud products (Debian's PEP 668 refusal,
//! "externally-managed-environment", is lifted by the image's `/etc/pip.conf`), for the
//! sandbox's ordinary user and for root. The package is a wheel made inside the sandbox, so
//! nothing is downloaded. On `node24`, `npm install` into a project works as the user.

use belljar_api::CreateSandbox;
use belljar_e2e::{Daemon, block_on, require_image, run, sh_ok};

/// Makes `/workspace/hello_bj-0.1-py3-none-any.whl`: one module, `hello_bj`.
const MAKE_WHEEL: &str = r#"
import zipfile, hashlib, base64
files = {
    "hello_bj/__init__.py": "GREETING = 'hello from a wheel'\n",
    "hello_bj-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: hello_bj\nVersion: 0.1\n",
    "hello_bj-0.1.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: e2e\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
def digest(text):
    d = hashlib.sha256(text.encode()).digest()
    return "sha256=" + base64.urlsafe_b64encode(d).rstrip(b"=").decode()
record = "".join(f"{p},{digest(t)},{len(t.encode())}\n" for p, t in files.items())
record += "hello_bj-0.1.dist-info/RECORD,,\n"
with zipfile.ZipFile("/workspace/hello_bj-0.1-py3-none-any.whl", "w") as z:
    for p, t in files.items():
        z.writestr(p, t)
    z.writestr("hello_bj-0.1.dist-info/RECORD", record)
"#;

#[test]
fn pip_install_works_on_python313_for_the_user_and_root() {
    require_image("python3.13");
    let daemon = Daemon::start();
    let client = daemon.unix();
    block_on(async {
        let s = daemon
            .create(
                &client,
                CreateSandbox {
                    image: Some("python3.13".into()),
                    ..Default::default()
                },
            )
            .await;
        let (code, out) = run(&client, &s.id, &["python3", "-c", MAKE_WHEEL], false).await;
        assert_eq!(code, 0, "making the wheel: {out}");
        let wheel = "/workspace/hello_bj-0.1-py3-none-any.whl";
        let pip = [
            "python3",
            "-m",
            "pip",
            "install",
            "--no-index",
            "--no-cache-dir",
            wheel,
        ];
        let (code, out) = run(&client, &s.id, &pip, false).await;
        assert_eq!(code, 0, "pip install as the user: {out}");
        assert!(!out.contains("externally-managed-environment"), "{out}");
        let (code, out) = run(
            &client,
            &s.id,
            &[
                "python3",
                "-c",
                "import hello_bj; print(hello_bj.GREETING, hello_bj.__file__)",
            ],
            false,
        )
        .await;
        assert_eq!(code, 0, "{out}");
        assert!(out.contains("hello from a wheel"), "{out}");
        assert!(
            out.contains("/.local/lib/python3.13/"),
            "the user site: {out}"
        );
        // As root it goes to /usr/local, beside (not over) apt's packages.
        let out = sh_ok(&client, &s.id, &format!("python3 -m pip install --no-index --no-cache-dir {wheel} && python3 -c 'import hello_bj; print(hello_bj.__file__)'")).await;
        assert!(
            out.contains("/usr/local/lib/python3.13/dist-packages/"),
            "{out}"
        );
        client.delete_sandbox(&s.id).await.expect("delete");
    });
}

/// Makes a package tarball in the sandbox, installs it into a project with `npm install` as
/// the ordinary user and requires it: no registry (nothing is downloaded), as on the cloud
/// products' node images.
const NPM_INSTALL: &str = r#"set -e
mkdir -p /workspace/hello-bj /workspace/app
cd /workspace/hello-bj
printf '{"name":"hello-bj","version":"0.1.0","main":"index.js"}' > package.json
echo 'module.exports = "hello from npm";' > index.js
npm pack --silent >/dev/null
cd /workspace/app
npm init -y >/dev/null
npm install --offline --no-audit --no-fund /workspace/hello-bj/hello-bj-0.1.0.tgz
node -e 'console.log(require("hello-bj"), require.resolve("hello-bj"))'
"#;

#[test]
fn npm_install_works_on_node24_for_the_user() {
    require_image("node24");
    let daemon = Daemon::start();
    let client = daemon.unix();
    block_on(async {
        let s = daemon
            .create(
                &client,
                CreateSandbox {
                    image: Some("node24".into()),
                    ..Default::default()
                },
            )
            .await;
        let (code, out) = run(&client, &s.id, &["sh", "-c", NPM_INSTALL], false).await;
        assert_eq!(code, 0, "npm install as the user: {out}");
        assert!(out.contains("hello from npm"), "{out}");
        assert!(
            out.contains("/workspace/app/node_modules/hello-bj/"),
            "the project's node_modules: {out}"
        );
        client.delete_sandbox(&s.id).await.expect("delete");
    });
}
