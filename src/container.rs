//! Which cgroup and container a process is in, and the cgroup v2
//! directories given on the command line (`--cgroup PATH`).
//!
//! A process's container is read from its cgroup path: the container
//! runtimes name the cgroups they make after the container's id (and
//! Kubernetes names the pod's cgroup after the pod's UID), in a few
//! layouts that depend on the cgroup driver (systemd or cgroupfs). The
//! files read are under `/proc` and belong to other processes, which may
//! change or vanish at any time: they are read with a size cap, and
//! whatever they hold gives an answer or None, never a panic.

use std::ffi::{CString, OsString};
use std::io::Read;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail};

/// At most this much of a file under `/proc/PID` is read: a cgroup or
/// status file is a few hundred bytes, and another process's file must
/// not make the profiler read without end.
const PROC_FILE_CAP: u64 = 64 * 1024;

/// At most this much of `/proc/self/mounts` is read: a container host can
/// have thousands of mounts, and the cgroup2 mount is usually among the
/// first; a cap keeps a pathological table from costing much.
const MOUNTS_CAP: u64 = 1024 * 1024;

/// `f_type` of a cgroup v2 file system (`linux/magic.h`).
const CGROUP2_SUPER_MAGIC: u64 = 0x6367_7270;

/// `f_type` of a cgroup v1 file system (`linux/magic.h`), named in the
/// error so that the user of a hybrid system knows why a v1 directory is
/// refused.
const CGROUP_SUPER_MAGIC: u64 = 0x0027_e0eb;

/// Where a process is: its cgroup path and what the path says of a container.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Container {
    /// The cgroup path (v2 line of /proc/PID/cgroup, or the v1 line used,
    /// see [`parse_proc_cgroup`]), e.g. "/system.slice/docker-<id>.scope".
    pub cgroup: String,
    /// The container id (lowercase hex as found, usually 64 chars), where
    /// the path names one.
    pub id: Option<String>,
    /// "docker", "containerd", "cri-o", "podman", where known from the path.
    pub runtime: Option<&'static str>,
    /// Kubernetes pod UID with dashes (the systemd driver writes it with
    /// underscores: converted), where the path names one.
    pub pod_uid: Option<String>,
}

impl Container {
    /// The name used in frames and headers: the first 12 characters of the
    /// id (as `docker ps` shows it); None outside any container.
    pub fn short_id(&self) -> Option<&str> {
        self.id.as_deref().map(|id| id.get(..12).unwrap_or(id))
    }

    /// Whether the path names a container or a pod: what makes one line of
    /// a hybrid system's cgroup file worth more than another.
    fn names_something(&self) -> bool {
        self.id.is_some() || self.pod_uid.is_some()
    }
}

/// One line of `/proc/PID/cgroup`: "hierarchy-id:controllers:path".
struct CgroupLine<'a> {
    /// 0 for the v2 hierarchy, the v1 hierarchy's number otherwise.
    hierarchy: u32,
    /// The v1 controllers, comma separated ("" on the v2 line).
    controllers: &'a str,
    /// The cgroup path, without the " (deleted)" the kernel appends when
    /// the cgroup is gone (a zombie's): the path still says where it was.
    path: &'a str,
}

/// One line of `/proc/PID/cgroup`, or None for a line that is not one
/// (the path may itself hold ':', hence at most three fields).
fn parse_line(line: &str) -> Option<CgroupLine<'_>> {
    let mut fields = line.splitn(3, ':');
    let hierarchy = fields.next()?;
    let controllers = fields.next()?;
    let path = fields.next()?;
    if hierarchy.is_empty() || !hierarchy.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let hierarchy = hierarchy.parse().ok()?;
    if !path.starts_with('/') {
        return None;
    }
    let path = path.strip_suffix(" (deleted)").unwrap_or(path);
    Some(CgroupLine {
        hierarchy,
        controllers,
        path,
    })
}

/// Parses the text of /proc/PID/cgroup into a Container.
///
/// The v2 line ("0::PATH") is used unless it has the process at the v2
/// root (or there is none) while a v1 line ("N:controllers:PATH") names a
/// container: on hybrid systems the container runtime may place the
/// process only in v1 cgroups. Then the
/// first v1 line whose path names a container id is used (else the first
/// naming a pod). Where no line names one, the v2 path (or, without a v2
/// line, the name=systemd v1 line's, else the first v1 line's) with no
/// container. None for text without any cgroup line (empty, garbage).
pub fn parse_proc_cgroup(text: &str) -> Option<Container> {
    let lines: Vec<CgroupLine<'_>> = text.lines().filter_map(parse_line).collect();
    let v2 = lines
        .iter()
        .find(|l| l.hierarchy == 0 && l.controllers.is_empty())
        .map(|l| classify(l.path));
    // A v2 path below the root is where the process is: a v1 line is
    // looked at only where the v2 hierarchy has it at its root (or has no
    // line), as on hybrid hosts whose runtime uses the v1 controllers.
    if let Some(v2) = &v2 {
        if v2.names_something() || !v2.cgroup.trim_end_matches('/').is_empty() {
            return Some(v2.clone());
        }
    }
    let v1: Vec<Container> = lines
        .iter()
        .filter(|l| l.hierarchy != 0)
        .map(|l| classify(l.path))
        .collect();
    if let Some(c) = v1.iter().find(|c| c.id.is_some()) {
        return Some(c.clone());
    }
    if let Some(c) = v1.iter().find(|c| c.pod_uid.is_some()) {
        return Some(c.clone());
    }
    if v2.is_some() {
        return v2;
    }
    let fallback = lines
        .iter()
        .filter(|l| l.hierarchy != 0)
        .find(|l| l.controllers.split(',').any(|c| c == "name=systemd"))
        .or_else(|| lines.first())?;
    Some(classify(fallback.path))
}

/// Whether `s` is a container id: exactly 64 lowercase hex digits (what
/// docker, containerd, cri-o and podman all use). Anything else is
/// rejected so that a service named like a runtime is not taken for one.
fn is_container_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Whether `s` is a pod UID (dashes already in place): a UUID, or the
/// 32 hex digits the kubelet gives static pods, so lowercase hex and
/// dashes, of a sane length.
fn is_pod_uid(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f' | b'-'))
        && s.bytes().any(|b| b != b'-')
}

/// The prefixes of a container's cgroup under each runtime, with the
/// runtime's name. The systemd driver ends them with ".scope"; cri-o's
/// and podman's cgroupfs drivers write them without.
const RUNTIME_PREFIXES: &[(&str, &str)] = &[
    ("docker-", "docker"),
    ("cri-containerd-", "containerd"),
    ("nerdctl-", "containerd"),
    ("crio-", "cri-o"),
    ("libpod-", "podman"),
];

/// The container id and runtime a path component names, if it names one.
/// `parent` is the component before it, `parent_is_pod` whether that is a
/// Kubernetes pod's cgroup (the cgroupfs driver names the container's
/// cgroup by its bare id, which says which runtime only under `docker`).
fn container_component<'a>(
    part: &'a str,
    parent: Option<&str>,
    parent_is_pod: bool,
) -> Option<(&'a str, Option<&'static str>)> {
    let stem = part.strip_suffix(".scope").unwrap_or(part);
    for &(prefix, runtime) in RUNTIME_PREFIXES {
        // "crio-conmon-<id>.scope" is cri-o's monitor, not the container:
        // "conmon-<id>" is not an id, so it is not taken.
        if let Some(id) = stem.strip_prefix(prefix) {
            if is_container_id(id) {
                return Some((id, Some(runtime)));
            }
        }
    }
    if is_container_id(part) {
        if parent == Some("docker") {
            return Some((part, Some("docker")));
        }
        // containerd's cgroupfs layout: a directory per containerd
        // namespace (nerdctl's "default", the CRI's "k8s.io").
        if matches!(parent, Some("default" | "k8s.io")) {
            return Some((part, Some("containerd")));
        }
        if parent_is_pod {
            return Some((part, None));
        }
    }
    None
}

/// The pod UID a path component names, if it names one: a systemd
/// driver's pod slice ("kubepods-<qos>-pod<uid>.slice",
/// "kubepods-pod<uid>.slice", also under a prefix as kind's
/// "kubelet-kubepods-..."; the uid's '-' written '_', since '-' separates
/// the slice's parents), or a cgroupfs driver's "pod<uid>" under a
/// `kubepods` component.
fn pod_component(part: &str, under_kubepods: bool) -> Option<String> {
    if let Some(stem) = part.strip_suffix(".slice") {
        let mut segments = stem.rsplit('-');
        let last = segments.next()?;
        if !segments.any(|s| s == "kubepods") {
            return None;
        }
        let uid = last.strip_prefix("pod")?.replace('_', "-");
        return is_pod_uid(&uid).then_some(uid);
    }
    if under_kubepods {
        let uid = part.strip_prefix("pod")?;
        return is_pod_uid(uid).then(|| uid.to_string());
    }
    None
}

/// What a cgroup path says of a container. Each component is looked at,
/// and the innermost container component wins (docker in docker, or a
/// kind node's pods inside the node's own container):
///  - systemd driver: `docker-<64hex>.scope` (docker),
///    `cri-containerd-<64hex>.scope` (containerd), `crio-<64hex>.scope`
///    (cri-o; but not `crio-conmon-<id>.scope`, the monitor),
///    `libpod-<64hex>.scope` (podman); the same names without ".scope"
///    are taken too (cri-o's and podman's cgroupfs drivers);
///  - cgroupfs driver: `/docker/<64hex>` (docker),
///    `/kubepods/<qos>/pod<uid>/<64hex>` and `/kubepods/pod<uid>/<64hex>`
///    (runtime unknown), `/libpod_parent/libpod-<64hex>` (podman);
///  - pods: `kubepods-<qos>-pod<uid>.slice` or `kubepods-pod<uid>.slice`
///    (systemd driver, '_' in the uid becoming '-'), `pod<uid>` under a
///    `kubepods` component (cgroupfs driver).
///
/// The pod is the innermost one outside the container (the container's
/// own); a pod slice without a container gives the pod and no id. An id
/// must be exactly 64 lowercase hex digits.
pub fn classify(cgroup: &str) -> Container {
    let mut under_kubepods = false;
    let mut parent: Option<&str> = None;
    let mut parent_is_pod = false;
    let mut pod: Option<String> = None;
    let mut found: Option<(&str, Option<&'static str>, Option<String>)> = None;
    for part in cgroup.split('/').filter(|p| !p.is_empty()) {
        if let Some((id, runtime)) = container_component(part, parent, parent_is_pod) {
            found = Some((id, runtime, pod.clone()));
        }
        let this_pod = pod_component(part, under_kubepods);
        parent_is_pod = this_pod.is_some();
        if this_pod.is_some() {
            pod = this_pod;
        }
        under_kubepods |= part == "kubepods";
        parent = Some(part);
    }
    let (id, runtime, pod_uid) = match found {
        Some((id, runtime, pod)) => (Some(id.to_string()), runtime, pod),
        None => (None, None, pod),
    };
    Container {
        cgroup: cgroup.to_string(),
        id,
        runtime,
        pod_uid,
    }
}

/// Up to `cap` bytes of the file at `path`, invalid UTF-8 replaced; None
/// if it cannot be opened or read (the process is gone, or not ours).
fn read_capped(path: &Path, cap: u64) -> Option<String> {
    let file = std::fs::File::open(path).ok()?;
    let mut bytes = Vec::new();
    file.take(cap).read_to_end(&mut bytes).ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// The processes in the cgroups `dirs` and every cgroup below them, from
/// their `cgroup.procs` files (each read to at most 4 MiB, 64 levels down
/// at most), sorted, each once.
pub fn processes_in(dirs: &[PathBuf]) -> Vec<u32> {
    fn walk(dir: &Path, depth: u32, out: &mut Vec<u32>) {
        if let Some(text) = read_capped(&dir.join("cgroup.procs"), 4 << 20) {
            out.extend(
                text.split_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok()),
            );
        }
        if depth >= 64 {
            return;
        }
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            // Not followed through links: cgroupfs has none.
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                walk(&e.path(), depth + 1, out);
            }
        }
    }
    let mut out = Vec::new();
    for d in dirs {
        walk(d, 0, &mut out);
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// Reads /proc/PID/cgroup (at most 64 KiB) and parses it; None if the
/// process is gone or the file says nothing.
pub fn of_process(pid: u32) -> Option<Container> {
    let text = read_capped(Path::new(&format!("/proc/{pid}/cgroup")), PROC_FILE_CAP)?;
    parse_proc_cgroup(&text)
}

/// The process's pid in its own (innermost) pid namespace, from the
/// `NSpid:` line of /proc/PID/status, where it differs from `pid` (None
/// where the same, absent, or unreadable): what the user sees in the
/// container (`ps` inside it, its logs).
pub fn namespace_pid(pid: u32) -> Option<u32> {
    let text = read_capped(Path::new(&format!("/proc/{pid}/status")), PROC_FILE_CAP)?;
    nspid_of_status(&text, pid)
}

/// The innermost pid of the `NSpid:` line of a status text, where it
/// differs from `pid`. A line with a field that is not a number gives
/// None rather than a guess.
fn nspid_of_status(status: &str, pid: u32) -> Option<u32> {
    let fields = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    let mut innermost = None;
    for field in fields.split_whitespace() {
        innermost = Some(field.parse::<u32>().ok()?);
    }
    innermost.filter(|&inner| inner != pid)
}

/// A cgroup v2 directory given by the user (`--cgroup PATH`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupDir {
    /// The path as given (for messages).
    pub path: PathBuf,
    /// The cgroup's id: the directory's inode number (what the kernel's
    /// kernfs node id is on 64-bit, and what bpf_get_current_cgroup_id
    /// returns).
    pub id: u64,
}

/// The `f_type` of the file system `path` is on.
fn fs_type(path: &Path) -> std::io::Result<u64> {
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: an all-zero statfs is a valid value of the plain C struct.
    let mut buf: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c_path` is a NUL-terminated string and `buf` a statfs the
    // call writes to; neither is kept after it.
    if unsafe { libc::statfs(c_path.as_ptr(), &mut buf) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // `f_type`'s C type differs between architectures; the magic numbers
    // are all positive 32-bit values.
    #[allow(clippy::unnecessary_cast)]
    let f_type = buf.f_type as u64 & 0xffff_ffff;
    Ok(f_type)
}

/// A readable name for the file systems a mistaken `--cgroup` is likely
/// on, for the error message.
fn fs_name(f_type: u64) -> String {
    let name = match f_type {
        CGROUP_SUPER_MAGIC => "a cgroup v1 file system",
        0x0102_1994 => "tmpfs",
        0xef53 => "ext2/3/4",
        0x5846_5342 => "xfs",
        0x9123_683e => "btrfs",
        0x794c_7630 => "overlayfs",
        0x6265_6572 => "sysfs",
        0x9fa0 => "procfs",
        other => return format!("a file system of type {other:#x}"),
    };
    name.to_string()
}

/// Checks that `path` is a directory on a cgroup2 file system and returns
/// it with its id (the id BPF programs see). Each error is one line
/// naming the path: it does not exist or cannot be read; it is not a
/// directory; it is on a cgroup v1 or other file system (then naming
/// where cgroup2 is mounted, if it is: on a hybrid system the user gave a
/// v1 directory and needs the unified hierarchy's).
pub fn cgroup_dir(path: &Path) -> anyhow::Result<CgroupDir> {
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => anyhow!("cgroup {shown} does not exist"),
        _ => anyhow!("cannot read cgroup {shown}: {e}"),
    })?;
    if !meta.is_dir() {
        bail!("cgroup {shown} is not a directory");
    }
    let f_type = fs_type(path).map_err(|e| anyhow!("cannot read cgroup {shown}: {e}"))?;
    if f_type != CGROUP2_SUPER_MAGIC {
        let mount = match cgroup2_mount() {
            Some(m) => format!("cgroup2 is mounted at {}", m.display()),
            None => "no cgroup2 file system is mounted".to_string(),
        };
        bail!("{shown} is on {}, not on cgroup2; {mount}", fs_name(f_type));
    }
    Ok(CgroupDir {
        path: path.to_path_buf(),
        id: meta.ino(),
    })
}

/// A field of /proc/self/mounts with the kernel's octal escapes (`\040`
/// for a space, and so on for tab, newline and backslash) undone.
fn unescape_mount_field(field: &str) -> Vec<u8> {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if let (b'\\', Some(&[a, b, c])) = (bytes[i], bytes.get(i + 1..i + 4)) {
            if [a, b, c].iter().all(|d| (b'0'..=b'7').contains(d)) {
                let value =
                    u32::from(a - b'0') * 64 + u32::from(b - b'0') * 8 + u32::from(c - b'0');
                if let Ok(byte) = u8::try_from(value) {
                    out.push(byte);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    out
}

/// The mount point of the first cgroup2 line of a mounts table.
fn cgroup2_in_mounts(mounts: &str) -> Option<PathBuf> {
    mounts.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        let _device = fields.next()?;
        let mount_point = fields.next()?;
        let fs = fields.next()?;
        (fs == "cgroup2")
            .then(|| PathBuf::from(OsString::from_vec(unescape_mount_field(mount_point))))
    })
}

/// Where cgroup2 is mounted (first cgroup2 line of /proc/self/mounts), if
/// anywhere: named when a `--cgroup` directory is refused.
pub fn cgroup2_mount() -> Option<PathBuf> {
    let mounts = read_capped(Path::new("/proc/self/mounts"), MOUNTS_CAP)?;
    cgroup2_in_mounts(&mounts)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "4b1a2c3d4e5f60718293a4b5c6d7e8f90123456789abcdef0123456789abcdef";
    const ID2: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const POD: &str = "1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901";
    const POD_US: &str = "1b2c3d4e_5f60_7182_93a4_b5c6d7e8f901";

    fn expect(path: &str, id: Option<&str>, runtime: Option<&str>, pod: Option<&str>) {
        let c = classify(path);
        assert_eq!(c.cgroup, path);
        assert_eq!(c.id.as_deref(), id, "id of {path}");
        assert_eq!(c.runtime, runtime, "runtime of {path}");
        assert_eq!(c.pod_uid.as_deref(), pod, "pod of {path}");
    }

    #[test]
    fn systemd_driver_kubernetes_containerd() {
        let path = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_US}.slice/cri-containerd-{ID}.scope"
        );
        expect(&path, Some(ID), Some("containerd"), Some(POD));
        assert_eq!(classify(&path).short_id(), Some(&ID[..12]));
    }

    #[test]
    fn systemd_driver_guaranteed_pod_and_pod_alone() {
        let path = format!("/kubepods.slice/kubepods-pod{POD_US}.slice/cri-containerd-{ID}.scope");
        expect(&path, Some(ID), Some("containerd"), Some(POD));
        let pod_only = format!(
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{POD_US}.slice"
        );
        expect(&pod_only, None, None, Some(POD));
        assert_eq!(classify(&pod_only).short_id(), None);
        // A qos slice is no pod.
        expect("/kubepods.slice/kubepods-burstable.slice", None, None, None);
    }

    #[test]
    fn docker_systemd_and_cgroupfs() {
        expect(
            &format!("/system.slice/docker-{ID}.scope"),
            Some(ID),
            Some("docker"),
            None,
        );
        expect(&format!("/docker/{ID}"), Some(ID), Some("docker"), None);
        expect(&format!("/docker/{ID}/"), Some(ID), Some("docker"), None);
        // Docker in docker: the inner container wins.
        expect(
            &format!("/docker/{ID}/docker/{ID2}"),
            Some(ID2),
            Some("docker"),
            None,
        );
        // A bare id elsewhere says nothing.
        expect(&format!("/somewhere/{ID}"), None, None, None);
    }

    #[test]
    fn cgroupfs_kubernetes() {
        let path = format!("/kubepods/besteffort/pod{POD}/{ID}");
        expect(&path, Some(ID), None, Some(POD));
        expect(
            &format!("/kubepods/pod{POD}/{ID}"),
            Some(ID),
            None,
            Some(POD),
        );
        expect(
            &format!("/kubepods/burstable/pod{POD}"),
            None,
            None,
            Some(POD),
        );
        // "pod..." outside kubepods is no pod.
        expect(&format!("/other/pod{POD}/{ID}"), None, None, None);
    }

    #[test]
    fn crio_and_its_monitor() {
        let base = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_US}.slice"
        );
        expect(
            &format!("{base}/crio-{ID}.scope"),
            Some(ID),
            Some("cri-o"),
            Some(POD),
        );
        expect(
            &format!("{base}/crio-conmon-{ID}.scope"),
            None,
            None,
            Some(POD),
        );
        expect(
            &format!("/kubepods/burstable/pod{POD}/crio-{ID}"),
            Some(ID),
            Some("cri-o"),
            Some(POD),
        );
    }

    #[test]
    fn podman() {
        expect(
            &format!("/machine.slice/libpod-{ID}.scope"),
            Some(ID),
            Some("podman"),
            None,
        );
        expect(
            &format!("/libpod_parent/libpod-{ID}"),
            Some(ID),
            Some("podman"),
            None,
        );
        // Rootless podman puts the processes in a child of the scope.
        expect(
            &format!("/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope/container"),
            Some(ID),
            Some("podman"),
            None,
        );
    }

    #[test]
    fn kind_node_pods_inside_a_docker_container() {
        let path = format!(
            "/system.slice/docker-{ID2}.scope/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{POD_US}.slice/cri-containerd-{ID}.scope"
        );
        expect(&path, Some(ID), Some("containerd"), Some(POD));
    }

    #[test]
    fn no_container() {
        expect("/system.slice/ssh.service", None, None, None);
        expect(
            "/user.slice/user-1000.slice/session-2.scope",
            None,
            None,
            None,
        );
        expect("/", None, None, None);
        expect("", None, None, None);
        expect("/system.slice/docker.service", None, None, None);
    }

    #[test]
    fn ids_must_be_64_lowercase_hex() {
        let short = &ID[..63];
        let long = format!("{ID}a");
        let upper = ID.to_uppercase();
        let not_hex = format!("{}g", &ID[..63]);
        for bad in [short, &long, &upper, &not_hex] {
            expect(
                &format!("/system.slice/docker-{bad}.scope"),
                None,
                None,
                None,
            );
            expect(&format!("/docker/{bad}"), None, None, None);
            expect(&format!("/kubepods/pod{POD}/{bad}"), None, None, Some(POD));
        }
    }

    #[test]
    fn odd_paths_do_not_panic() {
        for path in [
            "//",
            "docker-",
            "/docker/",
            ".scope",
            "/kubepods",
            "/kubepods/pod",
            "/kubepods-pod.slice",
            "/kubepods.slice/kubepods-pod_.slice",
            "-.slice",
            "/\u{e9}\u{1F600}/docker-\u{e9}.scope",
        ] {
            let c = classify(path);
            assert_eq!(c.id, None, "{path}");
            assert_eq!(c.pod_uid, None, "{path}");
        }
    }

    #[test]
    fn v2_line() {
        let text = format!("0::/system.slice/docker-{ID}.scope\n");
        let c = parse_proc_cgroup(&text).unwrap();
        assert_eq!(c.cgroup, format!("/system.slice/docker-{ID}.scope"));
        assert_eq!(c.id.as_deref(), Some(ID));
        assert_eq!(c.runtime, Some("docker"));
        let plain = parse_proc_cgroup("0::/system.slice/ssh.service\n").unwrap();
        assert_eq!(plain, classify("/system.slice/ssh.service"));
        assert_eq!(parse_proc_cgroup("0::/\n").unwrap(), classify("/"));
    }

    #[test]
    fn deleted_cgroup() {
        let text = format!("0::/system.slice/docker-{ID}.scope (deleted)\n");
        let c = parse_proc_cgroup(&text).unwrap();
        assert_eq!(c.id.as_deref(), Some(ID));
    }

    #[test]
    fn hybrid_uses_the_v1_line_naming_a_container() {
        let text = format!(
            "12:pids:/\n11:name=systemd:/system.slice/containerd.service\n4:memory:/docker/{ID}\n3:cpu,cpuacct:/docker/{ID}\n0::/\n"
        );
        let c = parse_proc_cgroup(&text).unwrap();
        assert_eq!(c.cgroup, format!("/docker/{ID}"));
        assert_eq!(c.id.as_deref(), Some(ID));
        assert_eq!(c.runtime, Some("docker"));
        // The v2 line wins when it names a container itself.
        let text = format!("4:memory:/docker/{ID2}\n0::/system.slice/docker-{ID}.scope\n");
        assert_eq!(parse_proc_cgroup(&text).unwrap().id.as_deref(), Some(ID));
    }

    #[test]
    fn a_v2_path_below_the_root_is_not_overridden_by_v1_lines() {
        // A process in a cgroup of its own in v2 is there, whatever a v1
        // line (which anyone with a delegated v1 subtree could name) says.
        let text = format!("4:memory:/docker/{ID}\n0::/user.slice/app.scope\n");
        let c = parse_proc_cgroup(&text).unwrap();
        assert_eq!(c, classify("/user.slice/app.scope"));
        assert_eq!(c.id, None);
    }

    #[test]
    fn containerd_without_kubernetes() {
        expect(
            &format!("/system.slice/nerdctl-{ID}.scope"),
            Some(ID),
            Some("containerd"),
            None,
        );
        expect(
            &format!("/default/{ID}"),
            Some(ID),
            Some("containerd"),
            None,
        );
        expect(&format!("/k8s.io/{ID}"), Some(ID), Some("containerd"), None);
        expect(&format!("/elsewhere/{ID}"), None, None, None);
    }

    #[test]
    fn hybrid_without_container_uses_the_v2_path() {
        let text = "9:name=systemd:/user.slice/session-1.scope\n4:memory:/user.slice\n0::/user.slice/session-1.scope\n";
        let c = parse_proc_cgroup(text).unwrap();
        assert_eq!(c, classify("/user.slice/session-1.scope"));
    }

    #[test]
    fn without_v2_line() {
        let text = "4:memory:/user.slice\n1:name=systemd:/user.slice/session-1.scope\n";
        assert_eq!(
            parse_proc_cgroup(text).unwrap(),
            classify("/user.slice/session-1.scope")
        );
        let text = "4:memory:/user.slice\n3:cpu:/\n";
        assert_eq!(parse_proc_cgroup(text).unwrap(), classify("/user.slice"));
        let text = format!("4:memory:/user.slice\n3:cpu:/kubepods/pod{POD}/{ID}\n");
        let c = parse_proc_cgroup(&text).unwrap();
        assert_eq!(c.id.as_deref(), Some(ID));
        assert_eq!(c.pod_uid.as_deref(), Some(POD));
    }

    #[test]
    fn garbage_and_empty() {
        for text in [
            "",
            "\n\n",
            "hello world",
            "0:/docker",
            "x::/docker\n",
            "::/",
            "0::relative\n",
            "-1::/\n",
            "99999999999999999999::/\n",
            "\u{0}\u{ff}:::",
        ] {
            assert_eq!(parse_proc_cgroup(text), None, "{text:?}");
        }
    }

    #[test]
    fn nspid() {
        assert_eq!(
            nspid_of_status("Name:\tx\nNSpid:\t4242\t1\n", 4242),
            Some(1)
        );
        assert_eq!(nspid_of_status("NSpid:\t4242\t17\t1\n", 4242), Some(1));
        assert_eq!(nspid_of_status("NSpid:\t4242\n", 4242), None);
        assert_eq!(nspid_of_status("Name:\tx\n", 4242), None);
        assert_eq!(nspid_of_status("NSpid:\n", 4242), None);
        assert_eq!(nspid_of_status("NSpid:\t4242\tx\n", 4242), None);
        assert_eq!(nspid_of_status("NSpid:\t4242\t99999999999\n", 4242), None);
    }

    #[test]
    fn this_process() {
        let me = std::process::id();
        let c = of_process(me).expect("our own cgroup");
        assert!(c.cgroup.starts_with('/'));
        // The test may itself run in a container; either way the answer is
        // the innermost pid, which is not `me` unless namespaced.
        if let Some(inner) = namespace_pid(me) {
            assert_ne!(inner, me);
        }
        assert_eq!(of_process(u32::MAX), None);
        assert_eq!(namespace_pid(u32::MAX), None);
    }

    #[test]
    fn mounts_table() {
        let table = "sysfs /sys sysfs rw 0 0\ntmpfs /sys/fs/cgroup tmpfs ro 0 0\ncgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\ncgroup2 /other cgroup2 rw 0 0\n";
        assert_eq!(
            cgroup2_in_mounts(table),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        assert_eq!(
            cgroup2_in_mounts("none /my\\040cgroup cgroup2 rw 0 0\n"),
            Some(PathBuf::from("/my cgroup"))
        );
        assert_eq!(
            cgroup2_in_mounts("none /a\\777 cgroup2 rw 0 0\n"),
            Some(PathBuf::from("/a\\777"))
        );
        assert_eq!(
            cgroup2_in_mounts("none /x\\04 cgroup2\n"),
            Some(PathBuf::from("/x\\04"))
        );
        assert_eq!(cgroup2_in_mounts("sysfs /sys sysfs rw 0 0\n"), None);
        assert_eq!(cgroup2_in_mounts(""), None);
    }

    #[test]
    fn the_cgroup2_mount_is_a_cgroup_dir() {
        let mount = cgroup2_mount().expect("a cgroup2 mount");
        let dir = cgroup_dir(&mount).unwrap();
        assert_eq!(dir.path, mount);
        assert_eq!(dir.id, std::fs::metadata(&mount).unwrap().ino());
    }

    #[test]
    fn other_file_systems_are_refused() {
        let err = cgroup_dir(Path::new("/tmp")).unwrap_err().to_string();
        assert!(err.contains("cgroup2"), "{err}");
        assert!(err.contains("/tmp"), "{err}");
        assert!(!err.contains('\n'), "{err}");
        // On a hybrid system, a v1 controller's directory.
        let v1 = Path::new("/sys/fs/cgroup/memory");
        if v1.is_dir() && cgroup2_mount().as_deref() != Some(Path::new("/sys/fs/cgroup")) {
            let err = cgroup_dir(v1).unwrap_err().to_string();
            assert!(err.contains("cgroup v1"), "{err}");
            assert!(err.contains("cgroup2 is mounted at"), "{err}");
        }
    }

    #[test]
    fn missing_paths_and_files_are_refused() {
        let missing = Path::new("/nonexistent/offcputime-cgroup-test");
        let err = cgroup_dir(missing).unwrap_err().to_string();
        assert!(
            err.contains("does not exist") && err.contains(missing.to_str().unwrap()),
            "{err}"
        );
        let err = cgroup_dir(Path::new("/proc/self/status"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a directory"), "{err}");
    }
}
