//! The processes tests start and let run (the binary, nginx, the browser test's Node.js and its
//! Chromium): each in a process group of its own, killed whole when its [`Group`] is dropped,
//! also when a test fails and unwinds. A process's own children (nginx's workers, Chromium's
//! renderers) go with it: killing only the process a test started left nginx's worker behind,
//! its master gone. `scripts/test.sh` checks after the suite that nothing is left.
//!
//! What a process writes is kept ([`Group::spawn_logged`]) and printed when the test that
//! started it fails, so that a failure seen once can be explained.

use std::process::{Child, Command, ExitStatus, Output, Stdio};

/// A child process and every process it starts.
pub struct Group {
    /// `None` once handed away by [`Group::wait_with_output`].
    child: Option<Child>,
    /// The leader's pid, which is the group's id.
    id: u32,
    /// Whether the leader was waited for.
    reaped: bool,
    /// Where its output goes, and what to call it, when it is kept.
    log: Option<(tempfile::NamedTempFile, String)>,
}

/// Which of a process's outputs [`Group::spawn_logged`] keeps: both, or its standard error alone
/// (its caller reads its standard output).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kept {
    Both,
    Stderr,
}

impl Group {
    /// Spawns `command` as the leader of a new process group.
    pub fn spawn(command: &mut Command) -> std::io::Result<Group> {
        use std::os::unix::process::CommandExt;
        let child = command.process_group(0).spawn()?;
        Ok(Group { id: child.id(), child: Some(child), reaped: false, log: None })
    }

    /// [`Group::spawn`], keeping what the process writes (`kept`) in a file, which is printed,
    /// headed by `name`, if the test that started it fails.
    pub fn spawn_logged(command: &mut Command, name: &str, kept: Kept) -> std::io::Result<Group> {
        let file = tempfile::NamedTempFile::new()?;
        command.stderr(Stdio::from(file.reopen()?));
        if kept == Kept::Both {
            command.stdout(Stdio::from(file.reopen()?));
        }
        let mut group = Group::spawn(command)?;
        group.log = Some((file, name.to_owned()));
        Ok(group)
    }

    /// What the process wrote so far, when it is kept.
    pub fn output(&self) -> String {
        self.log.as_ref().and_then(|(file, _)| std::fs::read_to_string(file.path()).ok()).unwrap_or_default()
    }

    pub fn child(&mut self) -> &mut Child {
        self.child.as_mut().expect("the child is still held")
    }

    pub fn id(&self) -> u32 {
        self.id
    }

    /// Sends `signal` (a name `kill -s` knows: `TERM`, `KILL`) to the leader alone.
    pub fn signal(&self, signal: &str) {
        let _ = Command::new("kill").args(["-s", signal, &self.id.to_string()]).status();
    }

    /// Waits for the leader to exit.
    pub fn wait(&mut self) -> std::io::Result<ExitStatus> {
        let status = self.child().wait()?;
        self.reaped = true;
        Ok(status)
    }

    /// The leader's exit status, if it has exited.
    pub fn try_wait(&mut self) -> std::io::Result<Option<ExitStatus>> {
        let status = self.child().try_wait()?;
        self.reaped |= status.is_some();
        Ok(status)
    }

    /// Waits for the leader with its piped output; the rest of the group is killed then.
    pub fn wait_with_output(mut self) -> std::io::Result<Output> {
        let child = self.child.take().expect("the child is still held");
        let output = child.wait_with_output();
        self.reaped = true;
        output
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        if std::thread::panicking()
            && let Some((_, name)) = &self.log
        {
            eprintln!(
                "---- what {name} (pid {}) wrote ----\n{}---- end of {name} ----",
                self.id,
                self.output()
            );
        }
        // The leader's children first (while the group's id is surely still its own), then it.
        // A group that has already gone is the usual case, and `kill` saying so is no news.
        let _ = Command::new("kill")
            .args(["-s", "KILL", "--", &format!("-{}", self.id)])
            .stderr(std::process::Stdio::null())
            .status();
        if let (Some(child), false) = (&mut self.child, self.reaped) {
            let _ = child.wait();
        }
    }
}

/// `scripts/test.sh`'s check after the suite judges only the processes its run started: those
/// that carry its mark in their environment, also one that left its process group, and never
/// a process of the same name that the suite did not start (a developer's own `node`).
#[test]
fn the_suite_judges_only_the_processes_it_started() {
    let dir = tempfile::tempdir().unwrap();
    // A program named as one the tests start, which waits.
    let node = dir.path().join("node");
    std::fs::copy("/bin/sleep", &node).unwrap();
    let mark = format!("check-{}-{}", std::process::id(), line!());
    let spawn = |marked: bool| {
        let mut command = Command::new(&node);
        command.arg("60");
        if marked {
            command.env("SUITE_RUN", &mark);
        } else {
            command.env_remove("SUITE_RUN");
        }
        Group::spawn(&mut command).unwrap()
    };
    let ours = spawn(true);
    let theirs = spawn(false);
    // One of ours that left its parent: started by a shell that exits at once (as `pg_ctl`
    // starts PostgreSQL's server).
    let detached = Command::new("sh")
        .args(["-c", "\"$0\" 60 >/dev/null 2>&1 & echo $!"])
        .arg(&node)
        .env("SUITE_RUN", &mark)
        .output()
        .unwrap();
    let detached: u32 = String::from_utf8_lossy(&detached.stdout).trim().parse().unwrap();
    let leftovers = |mark: &str| {
        let root = env!("CARGO_MANIFEST_DIR");
        let output = Command::new("bash")
            .args(["-c", &format!(". '{root}/scripts/lib.sh' && suite_leftovers \"$0\""), mark])
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let pids: Vec<u32> = String::from_utf8_lossy(&output.stdout)
            .lines()
            .map(|line| line.split_whitespace().next().unwrap().parse().unwrap())
            .collect();
        pids
    };
    let found = leftovers(&mark);
    let _ = Command::new("kill").args(["-s", "KILL", &detached.to_string()]).status();
    assert!(found.contains(&ours.id()), "{found:?}");
    assert!(found.contains(&detached), "{found:?}");
    assert!(!found.contains(&theirs.id()), "a process the run did not start is judged: {found:?}");
    assert_eq!(found.len(), 2, "{found:?}");
    // Another run's mark finds none of them.
    assert!(leftovers(&format!("{mark}-other")).is_empty());
}
