//! Env files: what a pod sources (`. /etc/portalloc/<pod>.env`), and the ConfigMap that holds
//! one per pod. Pure: the PortAllocation in, text and the ConfigMap object out.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::ObjectMeta;

use super::{EnvVar, PortAllocation, ResolveError};

/// Label on every ConfigMap of env files: the PortAllocation it was made from.
pub const ALLOCATION_LABEL: &str = "portalloc.dev/allocation";

/// `KEY=VALUE` lines, each prefixed with `prefix` (`export ` for a shell's eval). Values are
/// quoted for sh where needed, so `. file` gives each exactly.
pub fn env_lines(env: &[EnvVar], prefix: &str) -> String {
    env.iter()
        .map(|e| format!("{prefix}{}={}\n", e.name, quote_env_value(&e.value)))
        .collect()
}

/// A value as sh reads it back exactly: as is when it holds only characters sh takes literally
/// (ports, addresses, lists), else single-quoted with each `'` written `'\''`.
pub fn quote_env_value(value: &str) -> Cow<'_, str> {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_.,:/=@%+-".contains(c);
    if value.chars().all(plain) {
        Cow::Borrowed(value)
    } else {
        Cow::Owned(format!("'{}'", value.replace('\'', r"'\''")))
    }
}

/// The ConfigMap holding every pod's env file, named `name` (default: the PortAllocation's
/// `spec.configMap.name`, else `<allocation>-ports`), controlled by the PortAllocation so it goes
/// away with it (where a garbage collector runs).
pub fn env_configmap(pa: &PortAllocation, name: Option<&str>) -> Result<ConfigMap, ResolveError> {
    let all = pa.resolve_all()?;
    let name = name
        .map(str::to_string)
        .or_else(|| pa.spec.config_map.as_ref().map(|c| c.name.clone()))
        .unwrap_or_else(|| format!("{}-ports", pa.name_any()));
    // Each env file says so itself when its ports are reused on other nodes.
    let warning = pa
        .reused_ports_warning()
        .map(|w| format!("# warning: {w}\n"))
        .unwrap_or_default();
    let mut data: BTreeMap<String, String> = all
        .iter()
        .map(|(pod, env)| {
            (
                format!("{pod}.env"),
                format!("{warning}{}", env_lines(env, "")),
            )
        })
        .collect();
    data.insert(super::TOPOLOGY_FILE.to_string(), pa.topology_yaml()?);
    let owner = kube::Resource::controller_owner_ref(pa, &());
    Ok(ConfigMap {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: pa.namespace(),
            labels: Some(BTreeMap::from([(
                ALLOCATION_LABEL.to_string(),
                pa.name_any(),
            )])),
            owner_references: owner.map(|o| vec![o]),
            ..Default::default()
        },
        data: Some(data),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn var(name: &str, value: &str) -> EnvVar {
        EnvVar {
            name: name.into(),
            value: value.into(),
            source: String::new(),
        }
    }

    #[test]
    fn plain_values_stay_bare_and_others_are_quoted() {
        assert_eq!(quote_env_value("20001"), "20001");
        assert_eq!(
            quote_env_value("http://a-0.a.ns.svc:80,x=y@z%1+2"),
            "http://a-0.a.ns.svc:80,x=y@z%1+2"
        );
        assert_eq!(quote_env_value("a b"), "'a b'");
        assert_eq!(quote_env_value("it's"), r"'it'\''s'");
        assert_eq!(quote_env_value("$HOME"), "'$HOME'");
        assert_eq!(
            env_lines(&[var("A", "1"), var("B", "x y")], "export "),
            "export A=1\nexport B='x y'\n"
        );
    }

    /// The shell that sources the file, not our reading of it, decides what the values are.
    #[test]
    fn sourcing_the_file_in_sh_gives_every_value_exactly() {
        let values = [
            "--prefill http://prefill-0.prefill.ns.svc:30001 30002 --prefill http://prefill-1.prefill.ns.svc:30003 30004",
            "it's \"quoted\" $HOME `date` \\ back;slash & | * ? ~ #hash",
            "tab\there",
            "",
            "20000-20007",
        ];
        let env: Vec<EnvVar> = values
            .iter()
            .enumerate()
            .map(|(i, v)| var(&format!("V{i}"), v))
            .collect();
        let dir = std::env::temp_dir().join(format!("portalloc-env-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("pod-0.env");
        std::fs::write(&file, env_lines(&env, "")).unwrap();
        for (i, expected) in values.iter().enumerate() {
            let out = std::process::Command::new("sh")
                .arg("-c")
                .arg(format!(". \"$1\"; printf %s \"$V{i}\""))
                .arg("sh")
                .arg(&file)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(String::from_utf8_lossy(&out.stdout), *expected, "V{i}");
        }
        // Unquoted, a list value splits into words, as a router's `$PREFILL_ARGS` needs.
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(". \"$1\"; set -- $V0; printf %s \"$#\"")
            .arg("sh")
            .arg(&file)
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "6");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
