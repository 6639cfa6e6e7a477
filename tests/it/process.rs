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
