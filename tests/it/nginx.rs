//! nginx in front of recast nodes, on the load-balancing configuration that `docs/cluster.md`
//! gives, as pasted: only its ports are moved to free loopback ones. The binary comes from
//! Debian's `nginx-light`, which `scripts/test.sh` installs.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::process::{Group, Kept};

/// The ports of the documented configuration: nginx's, then the three nodes'.
const LISTEN: &str = "listen 8080;";
const NODES: [&str; 3] = ["127.0.0.1:8081", "127.0.0.1:8082", "127.0.0.1:8083"];

pub struct Nginx {
    /// nginx's master and workers, killed whole when dropped.
    _group: Group,
    dir: TempDir,
    pub port: u16,
}

impl Nginx {
    /// Starts nginx in front of `nodes` (`127.0.0.1:PORT` each) once `nginx -t` passes; panics
    /// with nginx's words when either fails.
    pub fn start(nodes: [&str; 3]) -> Nginx {
        let dir = TempDir::new().expect("a temporary directory");
        let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
        let mut site = documented();
        assert!(site.contains(LISTEN), "docs/cluster.md's configuration listens on 8080:\n{site}");
        site = site.replace(LISTEN, &format!("listen 127.0.0.1:{port};"));
        for (documented, node) in NODES.iter().zip(nodes) {
            assert!(site.contains(documented), "docs/cluster.md's configuration names {documented}:\n{site}");
            site = site.replace(documented, node);
        }
        Nginx::serve(&site, port, dir)
    }

    /// Starts nginx with `site` (the inside of its `http` block), which listens on `port` among
    /// others, in `dir`, once `nginx -t` passes; panics with nginx's words when either fails.
    pub fn serve(site: &str, port: u16, dir: TempDir) -> Nginx {
        let binary = binary();
        let root = dir.path();
        std::fs::write(root.join("recast.conf"), site).expect("write the site");
        std::fs::write(root.join("nginx.conf"), main_configuration(root)).expect("write nginx.conf");
        // When the tests run as root, nginx's workers run as `nobody` and make their temporary
        // files under this directory.
        set_mode(root, 0o755);
        let test = nginx(&binary, root, &["-t"])
            .output()
            .expect("nginx runs (Debian's `nginx-light`; ./scripts/test.sh installs it)");
        assert!(test.status.success(), "nginx -t refuses the configuration: {}", words(&test));
        let group =
            Group::spawn_logged(&mut nginx(&binary, root, &["-g", "daemon off;"]), "nginx", Kept::Both)
                .expect("nginx starts");
        let nginx = Nginx { _group: group, dir, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "nginx does not listen: {}", nginx.log());
            std::thread::sleep(Duration::from_millis(10));
        }
        nginx
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// nginx's error log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }
}

/// The ```nginx block of docs/cluster.md.
fn documented() -> String {
    let doc = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/cluster.md"))
        .expect("docs/cluster.md");
    let start =
        doc.find("```nginx\n").expect("docs/cluster.md has an nginx configuration") + "```nginx\n".len();
    let length = doc[start..].find("```").expect("the configuration block ends");
    doc[start..start + length].to_owned()
}

/// A whole nginx configuration that includes the site, with every file nginx writes in `root`.
fn main_configuration(root: &Path) -> String {
    let root = root.display();
    format!(
        "worker_processes 1;
pid {root}/nginx.pid;
error_log {root}/error.log warn;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path {root}/body;
    proxy_temp_path {root}/proxy;
    fastcgi_temp_path {root}/fastcgi;
    uwsgi_temp_path {root}/uwsgi;
    scgi_temp_path {root}/scgi;
    include {root}/recast.conf;
}}
"
    )
}

fn nginx(binary: &Path, root: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(binary);
    command.arg("-p").arg(root).arg("-c").arg(root.join("nginx.conf")).args(args);
    command
}

/// `/usr/sbin/nginx` (not on a user's `PATH` on Debian), or `nginx` from the `PATH`.
fn binary() -> PathBuf {
    let sbin = PathBuf::from("/usr/sbin/nginx");
    if sbin.is_file() { sbin } else { PathBuf::from("nginx") }
}

pub fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

fn words(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}
