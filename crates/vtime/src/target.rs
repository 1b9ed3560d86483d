//! Can the shim cover a program? Decided from its file before it starts.
//!
//! The shim works through the dynamic loader. A statically linked program
//! (no `PT_INTERP`) never loads it; a Go program reads the vDSO clock itself
//! and makes its own system calls, even when dynamically linked; a program
//! for another machine or word size cannot load our shim. All of those would
//! silently run in real time.

use std::io::Read;
use std::path::{Path, PathBuf};

/// Whether a program would run under the shim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Coverage {
    /// A dynamically linked ELF for this machine.
    Covered,
    /// A script whose interpreter was checked (the interpreter's verdict).
    Script {
        interpreter: PathBuf,
        verdict: Box<Coverage>,
    },
    /// Would run in real time, for the reason given.
    Uncovered(String),
}

impl Coverage {
    pub fn is_covered(&self) -> bool {
        match self {
            Coverage::Covered => true,
            Coverage::Script { verdict, .. } => verdict.is_covered(),
            Coverage::Uncovered(_) => false,
        }
    }

    /// The reason a program is not covered, if it is not.
    pub fn reason(&self) -> Option<String> {
        match self {
            Coverage::Covered => None,
            Coverage::Script { interpreter, verdict } => verdict
                .reason()
                .map(|r| format!("its interpreter {}: {r}", interpreter.display())),
            Coverage::Uncovered(r) => Some(r.clone()),
        }
    }
}

const PT_INTERP: u32 = 3;
const GO_BUILDINFO: &[u8] = b"\xff Go buildinf:";
const GO_BUILD_ID: &[u8] = b"Go build ID: \"";

/// The ELF machine number of the machine this crate was built for.
fn host_machine() -> u16 {
    if cfg!(target_arch = "x86_64") {
        62
    } else if cfg!(target_arch = "aarch64") {
        183
    } else if cfg!(target_arch = "riscv64") {
        243
    } else {
        0
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Classifies a program from its bytes (pure; the file is read by
/// [`classify_file`]). Bytes that are not ELF and not a script are
/// `Uncovered` with the reason.
pub fn classify_elf(bytes: &[u8]) -> Coverage {
    if bytes.len() < 64 || &bytes[..4] != b"\x7fELF" {
        return Coverage::Uncovered("not an ELF executable or a script".into());
    }
    let class64 = match bytes[4] {
        1 => false,
        2 => true,
        c => return Coverage::Uncovered(format!("unknown ELF class {c}")),
    };
    if bytes[5] != 1 {
        return Coverage::Uncovered("big-endian ELF: the shim is built for this little-endian machine".into());
    }
    let u16_at = |o: usize| bytes.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u32_at = |o: usize| {
        bytes
            .get(o..o + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let u64_at = |o: usize| {
        bytes
            .get(o..o + 8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    };
    let machine = u16_at(18).unwrap_or(0);
    if !class64 || machine != host_machine() {
        return Coverage::Uncovered(format!(
            "built for another machine or word size (ELF{} machine {machine}): it cannot load this machine's shim",
            if class64 { 64 } else { 32 }
        ));
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(32), u16_at(54), u16_at(56)) else {
        return Coverage::Uncovered("truncated ELF header".into());
    };
    let mut has_interp = false;
    for i in 0..u64::from(phnum) {
        let off = phoff.saturating_add(i * u64::from(phentsize));
        match usize::try_from(off).ok().and_then(u32_at) {
            Some(PT_INTERP) => has_interp = true,
            Some(_) => {}
            None => return Coverage::Uncovered("truncated ELF program headers".into()),
        }
    }
    if contains(bytes, GO_BUILDINFO) || contains(bytes, GO_BUILD_ID) {
        return Coverage::Uncovered(
            "a Go program: Go reads the vDSO clock and makes its own system calls, bypassing LD_PRELOAD".into(),
        );
    }
    if !has_interp {
        return Coverage::Uncovered(
            "statically linked (no program interpreter): the dynamic loader never loads the shim".into(),
        );
    }
    Coverage::Covered
}

/// Finds `cmd` as a shell would (a path if it has a slash, else `$PATH`).
pub fn resolve_command(cmd: &str) -> Option<PathBuf> {
    if cmd.contains('/') {
        let p = PathBuf::from(cmd);
        return p.is_file().then_some(p);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(cmd))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Classifies the program file at `path`; follows one `#!` line.
pub fn classify_file(path: &Path) -> std::io::Result<Coverage> {
    classify_file_depth(path, 0)
}

fn classify_file_depth(path: &Path, depth: u32) -> std::io::Result<Coverage> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)?.read_to_end(&mut bytes)?;
    if bytes.starts_with(b"#!") && depth < 4 {
        let line = bytes[2..].split(|&b| b == b'\n').next().unwrap_or(&[]);
        let line = String::from_utf8_lossy(line);
        let Some(interp) = line.split_whitespace().next() else {
            return Ok(Coverage::Uncovered("a script with an empty #! line".into()));
        };
        let interpreter = PathBuf::from(interp);
        let verdict = classify_file_depth(&interpreter, depth + 1)?;
        return Ok(Coverage::Script {
            interpreter,
            verdict: Box::new(verdict),
        });
    }
    Ok(classify_elf(&bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal little-endian ELF64 header with the given program header types.
    fn elf(types: &[u32], extra: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; 64];
        b[..4].copy_from_slice(b"\x7fELF");
        b[4] = 2;
        b[5] = 1;
        b[18..20].copy_from_slice(&host_machine().to_le_bytes());
        b[32..40].copy_from_slice(&64u64.to_le_bytes());
        b[54..56].copy_from_slice(&56u16.to_le_bytes());
        b[56..58].copy_from_slice(&(types.len() as u16).to_le_bytes());
        for t in types {
            let mut ph = vec![0u8; 56];
            ph[..4].copy_from_slice(&t.to_le_bytes());
            b.extend(ph);
        }
        b.extend_from_slice(extra);
        b
    }

    #[test]
    fn classifies_synthetic_programs() {
        assert_eq!(classify_elf(&elf(&[6, PT_INTERP, 1], b"")), Coverage::Covered);
        assert!(classify_elf(&elf(&[6, 1], b""))
            .reason()
            .unwrap()
            .contains("statically linked"));
        assert!(classify_elf(&elf(&[6, PT_INTERP], GO_BUILDINFO))
            .reason()
            .unwrap()
            .contains("Go program"));
        let mut other = elf(&[PT_INTERP], b"");
        other[18] ^= 0x40;
        assert!(classify_elf(&other).reason().unwrap().contains("another machine"));
        let mut truncated = elf(&[PT_INTERP], b"");
        truncated[56] = 50;
        assert!(classify_elf(&truncated).reason().unwrap().contains("truncated"));
        assert!(!classify_elf(b"hello").is_covered());
    }

    #[test]
    fn real_programs() {
        // The shell on any Debian system is dynamically linked.
        let sh = resolve_command("sh").expect("sh on PATH");
        assert!(classify_file(&sh).unwrap().is_covered());
        assert!(resolve_command("no-such-command-vtime").is_none());
    }
}
