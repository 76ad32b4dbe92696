//! Users end to end, as a platform team sets them up with the binaries: the first
//! platform admin's token minted into the stopped hub's store (`axle-hub
//! create-token`), `axle login` saving it (mode 0600), `axle token create` for a team
//! member, who may submit for their team and not for another, a CLI without
//! credentials refused with 401, and `axle get events` naming each actor.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use axle_e2e::{Ports, bin};

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `axle args` against `hub` with HOME `home` and AXLE_TOKEN `token`.
fn axle(hub: &str, home: &Path, token: Option<&str>, args: &[&str]) -> (i32, String, String) {
    let mut cmd = Command::new(bin("axle"));
    cmd.args(args)
        .env("AXLE_HUB", hub)
        .env("HOME", home)
        .env_remove("XDG_CONFIG_HOME")
        .env_remove("AXLE_TOKEN")
        .env_remove("AXLE_TEAM")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null());
    if let Some(t) = token {
        cmd.env("AXLE_TOKEN", t);
    }
    let out = cmd.output().expect("run axle");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_platform_team_sets_up_users_and_every_call_is_checked() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("hub");
    let policy = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/examples/policy");
    // The first platform admin's token, into the store before the hub runs.
    let out = Command::new(bin("axle-hub"))
        .args(["create-token", "--user", "platform-admin", "--data-dir"])
        .arg(&data)
        .env_remove("AXLE_STORE")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let root = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(root.starts_with("axle_"), "{root}");

    let ports = Ports::free();
    let log = std::fs::File::create(dir.path().join("hub.log")).unwrap();
    let _hub = Killed(
        Command::new(bin("axle-hub"))
            .args(["--policy", policy, "--insecure-no-tls", "--data-dir"])
            .arg(&data)
            .args(["--http", &format!("127.0.0.1:{}", ports.http)])
            .args(["--grpc", &format!("127.0.0.1:{}", ports.grpc)])
            .env_remove("AXLE_STORE")
            .env_remove("AXLE_AUTH")
            .env_remove("AXLE_SPOKE_TOKEN")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let hub = format!("http://127.0.0.1:{}", ports.http);
    let admin_home = dir.path().join("admin");
    let nobody = dir.path().join("nobody");
    std::fs::create_dir_all(&admin_home).unwrap();
    std::fs::create_dir_all(&nobody).unwrap();

    // The admin logs in: the token is checked, then saved readable by them only.
    let mut logged_in = (0, String::new(), String::new());
    for _ in 0..100 {
        logged_in = axle(&hub, &admin_home, None, &["login", "--with-token", &root]);
        if logged_in.0 == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(logged_in.0, 0, "{logged_in:?}");
    assert!(logged_in.1.contains("as platform-admin"), "{logged_in:?}");
    let config = admin_home.join(".config/axle/config.yaml");
    let mode = std::fs::metadata(&config).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);

    // A token for erin (a member of nlp), minted with the saved login.
    let (code, erin, err) = axle(
        &hub,
        &admin_home,
        None,
        &["token", "create", "--user", "erin", "--ttl", "1d"],
    );
    assert_eq!(code, 0, "{err}");
    let erin = erin.trim().to_string();
    let (code, me, _) = axle(&hub, &nobody, Some(&erin), &["whoami"]);
    assert_eq!(code, 0);
    assert!(me.contains("erin") && me.contains("nlp: member"), "{me}");

    let submit = |team: &str| {
        axle(
            &hub,
            &nobody,
            Some(&erin),
            &["submit", "--team", team, "--gpus", "1", "--", "sleep", "30"],
        )
    };
    let (code, out, err) = submit("nlp");
    assert_eq!(code, 0, "{out}{err}");
    let (code, _, err) = submit("vision");
    assert_eq!(code, 1);
    assert!(err.contains("erin may not submit for team vision"), "{err}");

    // No credentials at all: refused, with what to do.
    let (code, _, err) = axle(&hub, &nobody, None, &["get", "workloads"]);
    assert_eq!(code, 1);
    assert!(err.contains("no credentials"), "{err}");

    // The admin lists tokens (no secrets) and revokes erin's: refused from then on.
    let (code, list, err) = axle(&hub, &admin_home, None, &["token", "list"]);
    assert_eq!(code, 0, "{err}");
    let erin_id = list
        .lines()
        .find(|l| l.contains(" erin "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("erin's token listed: {list}"))
        .to_string();
    assert!(!list.contains(erin.rsplit('_').next().unwrap()), "{list}");
    let (code, out, err) = axle(&hub, &admin_home, None, &["token", "revoke", &erin_id]);
    assert_eq!(code, 0, "{out}{err}");
    let (code, _, err) = axle(&hub, &nobody, Some(&erin), &["whoami"]);
    assert_eq!(code, 1);
    assert!(err.contains("not valid"), "{err}");

    // The audit log names who did what.
    let (code, events, err) = axle(&hub, &admin_home, None, &["get", "events"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        events
            .lines()
            .any(|l| l.contains("submitted") && l.contains("erin")),
        "{events}"
    );
    assert!(
        events
            .lines()
            .any(|l| l.contains("token_created") && l.contains("platform-admin")),
        "{events}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_first_admin_comes_from_a_token_file_while_the_hub_runs_on_any_store() {
    let dir = tempfile::tempdir().unwrap();
    let policy = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/examples/policy");
    let out = Command::new(bin("axle-hub"))
        .args(["create-token", "--user", "platform-admin", "--print-only"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let token = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let file = dir.path().join("bootstrap-token");
    std::fs::write(&file, format!("{token}\n")).unwrap();
    let junk = dir.path().join("junk");
    std::fs::write(&junk, "hunter2").unwrap();
    let hub_cmd = |token_file: &Path, ports: Ports| {
        let mut cmd = Command::new(bin("axle-hub"));
        cmd.args(["--policy", policy, "--insecure-no-tls", "--data-dir"])
            .arg(dir.path().join("hub"))
            .args(["--http", &format!("127.0.0.1:{}", ports.http)])
            .args(["--grpc", &format!("127.0.0.1:{}", ports.grpc)])
            .arg("--bootstrap-token-file")
            .arg(token_file)
            .args(["--bootstrap-user", "platform-admin"])
            .env_remove("AXLE_STORE")
            .env_remove("AXLE_AUTH")
            .env_remove("AXLE_SPOKE_TOKEN")
            .stdout(Stdio::null());
        cmd
    };
    // A file that holds no token: the hub does not start, and says what to do.
    let out = hub_cmd(&junk, Ports::free()).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not an Axle API token") && err.contains("--print-only"),
        "{err}"
    );

    let ports = Ports::free();
    let log = std::fs::File::create(dir.path().join("hub.log")).unwrap();
    let _hub = Killed(hub_cmd(&file, ports).stderr(log).spawn().unwrap());
    let hub = format!("http://127.0.0.1:{}", ports.http);
    let mut me = (0, String::new(), String::new());
    for _ in 0..100 {
        me = axle(&hub, dir.path(), Some(&token), &["whoami"]);
        if me.0 == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(me.0, 0, "{me:?}");
    assert!(
        me.1.contains("platform-admin") && me.1.contains("platform admin"),
        "{me:?}"
    );
}
