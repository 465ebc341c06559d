//! Pods' cgroups as kubelet lays them out under cgroup v2, with either cgroup driver:
//!
//! | driver | Guaranteed | Burstable, BestEffort |
//! |---|---|---|
//! | `cgroupfs` | `kubepods/pod<UID>` | `kubepods/burstable/pod<UID>` |
//! | `systemd` | `kubepods.slice/kubepods-pod<UID_>.slice` | `kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<UID_>.slice` |
//!
//! (`UID_`: the pod's UID with `_` for `-`.) A cgroup's id, which the kernel's BPF helpers
//! give, is its directory's inode number.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// How kubelet names cgroups (its `--cgroup-driver`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CgroupDriver {
    Cgroupfs,
    Systemd,
}

/// Pod QoS classes, as the cgroup tree names them.
const QOS_CLASSES: [&str; 2] = ["burstable", "besteffort"];

impl CgroupDriver {
    /// The driver whose tree `root` shows: systemd's where `kubepods.slice` exists.
    pub fn detect(root: &Path) -> Self {
        if root.join(Self::Systemd.kubepods()).is_dir() {
            Self::Systemd
        } else {
            Self::Cgroupfs
        }
    }

    /// The directory of every pod, below the cgroup root.
    pub fn kubepods(self) -> &'static str {
        match self {
            Self::Cgroupfs => "kubepods",
            Self::Systemd => "kubepods.slice",
        }
    }

    /// The directory of a QoS class below `kubepods`.
    pub fn qos_dir(self, qos: &str) -> String {
        match self {
            Self::Cgroupfs => qos.to_string(),
            Self::Systemd => format!("kubepods-{qos}.slice"),
        }
    }

    /// The directory of pod `uid` below its QoS directory (`qos` None: Guaranteed, directly
    /// below `kubepods`).
    pub fn pod_dir(self, qos: Option<&str>, uid: &str) -> String {
        match (self, qos) {
            (Self::Cgroupfs, _) => format!("pod{uid}"),
            (Self::Systemd, None) => format!("kubepods-pod{}.slice", uid.replace('-', "_")),
            (Self::Systemd, Some(qos)) => {
                format!("kubepods-{qos}-pod{}.slice", uid.replace('-', "_"))
            }
        }
    }

    /// The pod UID a directory below `kubepods` (or a QoS directory) names, if it is a pod's.
    pub fn pod_uid(self, dir: &str) -> Option<String> {
        let uid = match self {
            Self::Cgroupfs => dir.strip_prefix("pod")?.to_string(),
            Self::Systemd => {
                let stem = dir.strip_suffix(".slice")?;
                let at = stem.rfind("-pod")? + 1;
                if !stem[..at].starts_with("kubepods-") {
                    return None;
                }
                stem[at + 3..].replace('_', "-")
            }
        };
        let valid = uid.len() >= 32 && uid.chars().all(|c| c.is_ascii_hexdigit() || c == '-');
        valid.then_some(uid)
    }
}

/// The pod and QoS cgroups found under `kubepods`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodCgroups {
    /// Pod UID → its cgroup id.
    pub pods: BTreeMap<String, u64>,
    /// The QoS directories' cgroup ids.
    pub qos_dirs: Vec<u64>,
}

/// A cgroup's id: its directory's inode number.
pub fn cgroup_id(dir: &Path) -> io::Result<u64> {
    Ok(fs::metadata(dir)?.ino())
}

/// Every pod cgroup under `kubepods` (an absent directory has none).
pub fn scan(kubepods: &Path, driver: CgroupDriver) -> io::Result<PodCgroups> {
    let mut found = PodCgroups::default();
    scan_pods(kubepods, driver, &mut found)?;
    for (dir, id) in qos_dirs(kubepods, driver)? {
        found.qos_dirs.push(id);
        scan_pods(&dir, driver, &mut found)?;
    }
    Ok(found)
}

/// The QoS directories under `kubepods` that exist, and their cgroup ids.
pub fn qos_dirs(kubepods: &Path, driver: CgroupDriver) -> io::Result<Vec<(PathBuf, u64)>> {
    let mut found = Vec::new();
    for qos in QOS_CLASSES {
        let dir = kubepods.join(driver.qos_dir(qos));
        match cgroup_id(&dir) {
            Ok(id) => found.push((dir, id)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(found)
}

fn scan_pods(dir: &Path, driver: CgroupDriver, found: &mut PodCgroups) -> io::Result<()> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let Some(uid) = entry.file_name().to_str().and_then(|n| driver.pod_uid(n)) else {
            continue;
        };
        match entry.metadata() {
            Ok(meta) if meta.is_dir() => {
                found.pods.insert(uid, meta.ino());
            }
            // Removed as we looked: the pod is gone.
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The cgroup v2 filesystem's magic number (`statfs(2)`).
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;

/// Whether `path` lies on a cgroup v2 filesystem.
pub fn is_cgroup2(path: &Path) -> bool {
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: `statfs` writes into the zeroed struct we own; the path is NUL-terminated.
    unsafe {
        let mut stat: libc::statfs = std::mem::zeroed();
        libc::statfs(c_path.as_ptr(), &mut stat) == 0 && stat.f_type as i64 == CGROUP2_SUPER_MAGIC
    }
}

/// The cgroup level of `dir` (the hierarchy's root is level 0), from where its cgroup v2 mount
/// sits and which part of the hierarchy that mount shows (`/proc/self/mountinfo`).
pub fn level(dir: &Path) -> io::Result<u32> {
    let dir = fs::canonicalize(dir)?;
    let mountinfo = fs::read_to_string("/proc/self/mountinfo")?;
    let (mount_point, mount_root) = cgroup2_mount_of(&mountinfo, &dir).ok_or_else(|| {
        io::Error::other(format!("{} is not on a cgroup v2 mount", dir.display()))
    })?;
    let below = dir.strip_prefix(&mount_point).expect("the mount holds dir");
    Ok(depth(&mount_root) + depth(below))
}

fn depth(path: &Path) -> u32 {
    path.components()
        .filter(|c| matches!(c, std::path::Component::Normal(_)))
        .count() as u32
}

/// The cgroup2 mount holding `dir` (the longest mount point above it), as (mount point, the
/// hierarchy path it shows).
fn cgroup2_mount_of(mountinfo: &str, dir: &Path) -> Option<(PathBuf, PathBuf)> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let fs_type = right.split_whitespace().next()?;
            let mut fields = left.split_whitespace();
            let root = fields.nth(3)?;
            let mount_point = fields.next()?;
            (fs_type == "cgroup2").then(|| (PathBuf::from(mount_point), PathBuf::from(root)))
        })
        .filter(|(mount_point, _)| dir.starts_with(mount_point))
        .max_by_key(|(mount_point, _)| mount_point.as_os_str().len())
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";

    #[test]
    fn both_drivers_name_every_qos_class_as_kubelet_does() {
        use CgroupDriver::*;
        assert_eq!(Cgroupfs.pod_dir(None, UID), format!("pod{UID}"));
        assert_eq!(
            Cgroupfs.pod_dir(Some("burstable"), UID),
            format!("pod{UID}")
        );
        assert_eq!(
            Systemd.pod_dir(None, UID),
            "kubepods-pod0f1e2d3c_4b5a_6978_8796_a5b4c3d2e1f0.slice"
        );
        assert_eq!(
            Systemd.pod_dir(Some("besteffort"), UID),
            "kubepods-besteffort-pod0f1e2d3c_4b5a_6978_8796_a5b4c3d2e1f0.slice"
        );
        assert_eq!(Systemd.qos_dir("burstable"), "kubepods-burstable.slice");
        for driver in [Cgroupfs, Systemd] {
            for qos in [None, Some("burstable"), Some("besteffort")] {
                assert_eq!(
                    driver.pod_uid(&driver.pod_dir(qos, UID)).as_deref(),
                    Some(UID)
                );
            }
        }
    }

    #[test]
    fn other_directories_are_no_pods() {
        use CgroupDriver::*;
        assert_eq!(Cgroupfs.pod_uid("burstable"), None);
        assert_eq!(Cgroupfs.pod_uid("podnothex"), None);
        assert_eq!(Systemd.pod_uid("kubepods-burstable.slice"), None);
        assert_eq!(Systemd.pod_uid("system.slice"), None);
        assert_eq!(
            Systemd.pod_uid(&format!("cri-containerd-pod{UID}.scope")),
            None
        );
    }

    #[test]
    fn the_mount_holding_a_directory_is_the_longest_above_it() {
        let mountinfo = "\
30 23 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro
31 30 0:27 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
40 23 0:27 /kubelet.slice /host/cgroup rw - cgroup2 cgroup2 rw";
        let (mount, root) =
            cgroup2_mount_of(mountinfo, Path::new("/sys/fs/cgroup/unified/a/kubepods")).unwrap();
        assert_eq!(
            (mount.as_path(), root.as_path()),
            (Path::new("/sys/fs/cgroup/unified"), Path::new("/"))
        );
        let (_, root) = cgroup2_mount_of(mountinfo, Path::new("/host/cgroup/kubepods")).unwrap();
        assert_eq!(depth(&root) + depth(Path::new("kubepods")), 2);
        assert_eq!(
            cgroup2_mount_of(mountinfo, Path::new("/sys/fs/cgroup/memory")),
            None
        );
    }
}
