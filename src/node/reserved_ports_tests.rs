//! The setting read whole, others' entries kept, and a writer racing the agent.

use super::*;
use std::cell::{Cell, RefCell};

fn set(text: &str) -> BTreeSet<u16> {
    parse(text).unwrap()
}

/// Others' entries of several KiB, in no order, some overlapping: ranges of every length
/// and single ports.
fn long_value_of_others() -> (String, BTreeSet<u16>) {
    let mut entries = vec!["30000-32767".to_string(), "33000-33009".to_string()];
    for i in 0..900u32 {
        let port = 1024 + (i * 7919) % 20_000;
        entries.push(match i % 3 {
            0 => port.to_string(),
            1 => format!("{port}-{}", port + 1),
            _ => format!("{port}-{}", port + i % 40),
        });
    }
    entries.push("8080".into());
    let text = entries.join(",");
    let ports = set(&text);
    (text, ports)
}

#[test]
fn text_round_trips_as_the_kernel_prints_it() {
    assert_eq!(
        format(&set("8080, 30000-30002,30003,9\n")),
        "9,8080,30000-30003"
    );
    assert_eq!(format(&set("")), "");
    assert_eq!(format(&set("\n")), "");
    assert_eq!(format(&set("65535")), "65535");
    assert_eq!(parse("10-5"), Err(BadEntry("10-5".into())));
    assert_eq!(parse("1,x,2"), Err(BadEntry("x".into())));
    assert_eq!(parse("70000"), Err(BadEntry("70000".into())));
    // A read cut short ends inside an entry: a range whose last port lost digits runs
    // backwards, so it is refused rather than read as a shorter range.
    assert_eq!(
        parse("30000-32767,33000-33009,34000-34"),
        Err(BadEntry("34000-34".into()))
    );
}

#[test]
fn the_longest_text_is_pairs_of_ports_and_fits_the_buffer() {
    // Longest over every set of ports, by dynamic programming over the ports in order:
    // each entry costs its digits, a '-' and its last port's digits if a range, and a ','
    // or the final newline.
    let digits = |p: u32| p.to_string().len() as i64;
    let none = i64::MIN / 2;
    let (mut out, mut started, mut running) = (0i64, none, none);
    for p in 0..=u32::from(u16::MAX) {
        let closed = if running > none {
            running + 1 + digits(p - 1)
        } else {
            none
        };
        let next = (
            out.max(started).max(closed),
            out + digits(p) + 1,
            started.max(running),
        );
        (out, started, running) = next;
    }
    let longest = out.max(started).max(running + 1 + digits(65535));
    assert_eq!(longest as usize, MAX_TEXT);
    let pairs: BTreeSet<u16> = (10_000u16..65_535)
        .filter(|p| (p - 10_000) % 3 != 2)
        .collect();
    assert!(format(&pairs).len() < MAX_TEXT);
}

#[test]
fn read_whole_reads_past_the_first_buffer_and_refuses_more_than_the_kernel_prints() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("setting");
    for len in [
        0,
        31,
        32,
        FIRST_READ - 1,
        FIRST_READ,
        FIRST_READ + 1,
        MAX_TEXT,
    ] {
        let text = "7".repeat(len);
        fs::write(&file, &text).unwrap();
        assert_eq!(read_whole(&file).unwrap(), text, "{len} bytes");
    }
    fs::write(&file, "7".repeat(MAX_TEXT + 1)).unwrap();
    let refused = read_whole(&file).unwrap_err().to_string();
    assert!(refused.contains("longer than 254738 bytes"), "{refused}");
}

#[test]
fn entries_of_others_stay_and_only_ours_go() {
    // Someone reserved 8080 and 30005; a pool covers 30000-30009.
    let first = plan(&set("8080,30005"), &set(""), &set("30000-30009"));
    assert_eq!(format(&first.reserved), "8080,30000-30009");
    assert_eq!(format(&first.ours), "30000-30004,30006-30009");
    // The pool is deleted: 30005 was never ours, so it stays.
    let gone = plan(&first.reserved, &first.ours, &set(""));
    assert_eq!(format(&gone.reserved), "8080,30005");
    assert!(gone.ours.is_empty());
}

#[test]
fn apply_keeps_its_record_across_runs() {
    let dir = tempfile::tempdir().unwrap();
    let sysctl = dir.path().join("sysctl");
    fs::write(&sysctl, "22\n").unwrap();
    let reserved = ReservedPorts::at(&sysctl, &dir.path().join("state"));
    assert!(reserved.apply(&set("30000-30002")).unwrap().written);
    assert_eq!(fs::read_to_string(&sysctl).unwrap(), "22,30000-30002\n");
    assert!(!reserved.apply(&set("30000-30002")).unwrap().written);
    // A second agent (a restart) reads the record and removes only its entries.
    let restarted = ReservedPorts::at(&sysctl, &dir.path().join("state"));
    restarted.apply(&set("30001")).unwrap();
    assert_eq!(fs::read_to_string(&sysctl).unwrap(), "22,30001\n");
}

#[test]
fn a_value_of_several_kib_is_kept_whole_and_ours_come_and_go() {
    let (text, others) = long_value_of_others();
    assert!(text.len() > 4 * 1024, "{} bytes", text.len());
    let dir = tempfile::tempdir().unwrap();
    let sysctl = dir.path().join("sysctl");
    fs::write(&sysctl, format!("{text}\n")).unwrap();
    let reserved = ReservedPorts::at(&sysctl, &dir.path().join("state"));
    let pools = set("45000-45009,30005,60000");
    let done = reserved.apply(&pools).unwrap();
    let expected: BTreeSet<u16> = others.union(&pools).copied().collect();
    assert_eq!(set(&fs::read_to_string(&sysctl).unwrap()), expected);
    assert_eq!(
        done.ours,
        set("45000-45009,60000"),
        "30005 was someone else's"
    );
    reserved.apply(&set("")).unwrap();
    assert_eq!(set(&fs::read_to_string(&sysctl).unwrap()), others);
}

/// What another writer does to the value at a read of the agent's (counted from 1).
type OtherWriter = Box<dyn Fn(usize, &mut String)>;

/// A setting in memory with another writer acting at chosen reads.
struct Raced {
    value: RefCell<String>,
    reads: Cell<usize>,
    other_writer: OtherWriter,
}

impl Setting for Raced {
    fn read(&self) -> io::Result<String> {
        let read = self.reads.get() + 1;
        self.reads.set(read);
        (self.other_writer)(read, &mut self.value.borrow_mut());
        Ok(self.value.borrow().clone())
    }

    fn write(&self, text: &str) -> io::Result<()> {
        *self.value.borrow_mut() = text.to_string();
        Ok(())
    }
}

fn raced(value: &str, other_writer: impl Fn(usize, &mut String) + 'static) -> Raced {
    Raced {
        value: RefCell::new(value.to_string()),
        reads: Cell::new(0),
        other_writer: Box::new(other_writer),
    }
}

#[test]
fn a_writer_between_the_agents_read_and_write_is_not_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let reserved = ReservedPorts::at(&dir.path().join("sysctl"), dir.path());
    // Another writer adds 9000 after the agent's first read, before its write.
    let setting = raced("8080\n", |read, value| {
        if read == 2 {
            *value = "8080,9000\n".into();
        }
    });
    let done = reserved.apply_to(&setting, &set("45000-45001")).unwrap();
    assert!(done.written);
    assert_eq!(setting.value.borrow().as_str(), "8080,9000,45000-45001\n");
}

#[test]
fn a_writer_after_the_agents_write_keeps_its_entries_and_ours_go_back() {
    let dir = tempfile::tempdir().unwrap();
    let reserved = ReservedPorts::at(&dir.path().join("sysctl"), dir.path());
    // Another writer that planned from the old value writes after the agent: 9000 added,
    // the agent's entries gone.
    let setting = raced("8080\n", |read, value| {
        if read == 3 {
            *value = "8080,9000\n".into();
        }
    });
    reserved.apply_to(&setting, &set("45000-45001")).unwrap();
    assert_eq!(setting.value.borrow().as_str(), "8080,9000,45000-45001\n");
    assert_eq!(reserved.ours().unwrap(), set("45000-45001"));
}

#[test]
fn a_setting_that_never_holds_still_is_given_up_for_the_round_and_said_so() {
    let dir = tempfile::tempdir().unwrap();
    let reserved = ReservedPorts::at(&dir.path().join("sysctl"), dir.path());
    let setting = raced("8080\n", |read, value| {
        *value = format!("8080,{}\n", 9000 + read)
    });
    let refused = reserved
        .apply_to(&setting, &set("45000"))
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("changed under another writer 5 times in a row"),
        "{refused}"
    );
    // What the agent may have added is on record, so a later round removes it.
    assert!(reserved.ours().unwrap().contains(&45000));
}

#[test]
fn errors_name_their_true_cause() {
    let dir = tempfile::tempdir().unwrap();
    let sysctl = dir.path().join("sysctl");
    fs::write(&sysctl, "30000-32767,34000-34\n").unwrap();
    let reserved = ReservedPorts::at(&sysctl, &dir.path().join("state"));
    let refused = reserved.apply(&set("45000")).unwrap_err().to_string();
    assert!(
        refused.contains("holds \"34000-34\", which is not a port or a range"),
        "{refused}"
    );
    assert!(!refused.contains("CAP_NET_ADMIN"), "{refused}");
    assert_eq!(
        fs::read_to_string(&sysctl).unwrap(),
        "30000-32767,34000-34\n",
        "left as it was"
    );
    let denied = ReserveError::Write {
        path: SYSCTL.into(),
        source: io::Error::from_raw_os_error(libc::EPERM),
    };
    assert!(
        denied.to_string().contains("needs CAP_NET_ADMIN"),
        "{denied}"
    );
    let other = ReserveError::Write {
        path: SYSCTL.into(),
        source: io::Error::from_raw_os_error(libc::EINVAL),
    };
    assert!(!other.to_string().contains("CAP_NET_ADMIN"), "{other}");
}
