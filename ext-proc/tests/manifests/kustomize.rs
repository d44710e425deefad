//! kustomize, as far as the overlays use it: rendering an overlay (resources, components,
//! JSON and strategic-merge patches, the namespace transformer), and `kubectl kustomize` to
//! compare with when kubectl is installed.

use super::*;

pub(crate) fn namespaced(kind: &str) -> bool {
    !matches!(kind, "Namespace" | "ClusterRole" | "ClusterRoleBinding")
}

/// An overlay as kustomize renders it, for the features used here: `resources` (files, and
/// directories with their own kustomization), `components` (directories holding a
/// `kind: Component` kustomization: its resources, then its patches), `patches` (JSON patch
/// files, and strategic-merge patches holding only maps, each with a `target` by kind and
/// name), and the builtin NamespaceTransformer with `unsetOnly: true` and
/// `setRoleBindingSubjects: none`; in kustomize's order: resources, components, patches,
/// transformers.
pub(crate) fn render(dir: &Path) -> Vec<Doc> {
    let kustomization = load(&dir.join("kustomization.yaml"));
    assert_eq!(kustomization.len(), 1, "{}: one document", dir.display());
    let k: cr::Kustomization = custom(&kustomization[0]);
    assert_eq!(
        (k.api_version.as_str(), k.kind.as_str()),
        ("kustomize.config.k8s.io/v1beta1", "Kustomization"),
        "{}",
        dir.display()
    );
    let mut objects = Vec::new();
    add_resources(dir, &k.resources, &mut objects);
    for c in &k.components {
        let cdir = std::fs::canonicalize(dir.join(c))
            .unwrap_or_else(|e| panic!("{}: component {c}: {e}", dir.display()));
        let docs = load(&cdir.join("kustomization.yaml"));
        assert_eq!(docs.len(), 1, "{}: one document", cdir.display());
        let comp: cr::Component = custom(&docs[0]);
        assert_eq!(
            (comp.api_version.as_str(), comp.kind.as_str()),
            ("kustomize.config.k8s.io/v1alpha1", "Component"),
            "{}",
            cdir.display()
        );
        add_resources(&cdir, &comp.resources, &mut objects);
        for patch in &comp.patches {
            apply_patch(&cdir, patch, &mut objects);
        }
    }
    for patch in &k.patches {
        apply_patch(dir, patch, &mut objects);
    }
    for t in &k.transformers {
        for doc in load(&dir.join(t)) {
            let nt: cr::NamespaceTransformer = custom(&doc);
            assert_eq!(nt.kind, "NamespaceTransformer", "{}", doc.origin);
            assert!(
                nt.unset_only,
                "{}: only unsetOnly: true is modelled here",
                doc.origin
            );
            assert_eq!(
                nt.set_role_binding_subjects,
                Some(cr::RoleBindingSubjects::None),
                "{}: only setRoleBindingSubjects: none is modelled here",
                doc.origin
            );
            let ns = nt.metadata.namespace.expect("the transformer's namespace");
            for o in &mut objects {
                if namespaced(o.kind()) && o.namespace().is_none() {
                    o.value["metadata"]["namespace"] = Value::String(ns.clone());
                }
            }
        }
    }
    let mut ids = BTreeSet::new();
    for o in &objects {
        assert!(
            ids.insert(key(o)),
            "{}: {:?} twice (kustomize refuses that)",
            dir.display(),
            key(o)
        );
    }
    objects
}

fn add_resources(dir: &Path, resources: &[String], objects: &mut Vec<Doc>) {
    for r in resources {
        let p = std::fs::canonicalize(dir.join(r))
            .unwrap_or_else(|e| panic!("{}: resource {r}: {e}", dir.display()));
        if p.is_dir() {
            objects.extend(render(&p));
        } else {
            objects.extend(load(&p));
        }
    }
}

/// The YAML of a patch file: a list of JSON patch operations, or one object.
fn patch_value(path: &Path) -> Value {
    let text = read(path);
    let mut values = Vec::new();
    for de in serde_yaml_ng::Deserializer::from_str(&text) {
        let v = Value::deserialize(de).unwrap_or_else(|e| panic!("{}: {e}", rel(path)));
        if !v.is_null() {
            values.push(v);
        }
    }
    assert_eq!(values.len(), 1, "{}: one patch per file", rel(path));
    values.pop().expect("one value")
}

/// The files kustomizations (and components) under `root` name as JSON patches.
pub(crate) fn json_patch_files(root: &Path) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    for f in yaml_files(root) {
        if f.file_name().and_then(|n| n.to_str()) != Some("kustomization.yaml") {
            continue;
        }
        let dir = f.parent().expect("a directory");
        let doc = &load(&f)[0];
        let patches: Vec<cr::Patch> = match doc.kind() {
            "Kustomization" => custom::<cr::Kustomization>(doc).patches,
            "Component" => custom::<cr::Component>(doc).patches,
            other => panic!("{}: kind {other}", rel(&f)),
        };
        for p in patches {
            let path = std::fs::canonicalize(dir.join(&p.path))
                .unwrap_or_else(|e| panic!("{}: patch {}: {e}", rel(&f), p.path));
            if patch_value(&path).is_array() {
                out.insert(path);
            }
        }
    }
    out
}

fn apply_patch(dir: &Path, patch: &cr::Patch, objects: &mut [Doc]) {
    let path = dir.join(&patch.path);
    let value = patch_value(&path);
    let origin = rel(&path);
    let target = patch
        .target
        .as_ref()
        .unwrap_or_else(|| panic!("{origin}: only patches with a target are modelled here"));
    let mut matched = 0;
    for o in objects.iter_mut() {
        if o.kind() != target.kind || o.name() != target.name {
            continue;
        }
        matched += 1;
        match &value {
            Value::Array(_) => {
                let ops: Vec<cr::JsonPatchOp> = serde_json::from_value(value.clone())
                    .unwrap_or_else(|e| panic!("{origin}: not a JSON patch: {e}"));
                for op in &ops {
                    json_patch(&mut o.value, op)
                        .unwrap_or_else(|e| panic!("{origin}: {op:?} on {}: {e}", o.origin));
                }
            }
            Value::Object(_) => {
                assert_eq!(
                    (value["kind"].as_str(), value["metadata"]["name"].as_str()),
                    (Some(o.kind()), Some(o.name())),
                    "{origin}: a strategic-merge patch names its target"
                );
                merge_maps(&mut o.value, &value, &origin);
            }
            other => panic!("{origin}: not a patch: {other}"),
        }
        o.origin = format!("{} patched by {origin}", o.origin);
    }
    assert!(
        matched > 0,
        "{origin}: no {} {} to patch",
        target.kind,
        target.name
    );
}

/// A strategic merge of `patch` into `into` where the patch holds only maps and scalars: maps
/// merge key by key, scalars replace. (Lists merge by keys that depend on the field; none is
/// modelled, so a list in a patch fails.)
fn merge_maps(into: &mut Value, patch: &Value, origin: &str) {
    match (into, patch) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                match a.get_mut(k) {
                    Some(existing) if v.is_object() && existing.is_object() => {
                        merge_maps(existing, v, origin)
                    }
                    _ => {
                        assert!(
                            !v.is_array() && !v.is_null(),
                            "{origin}: {k}: lists and deletions in strategic-merge patches are not modelled here"
                        );
                        a.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (_, _) => panic!("{origin}: a strategic-merge patch is a map"),
    }
}

/// RFC 6901 pointer tokens.
fn pointer_tokens(path: &str) -> Result<Vec<String>, String> {
    let rest = path
        .strip_prefix('/')
        .ok_or_else(|| format!("{path}: not a JSON pointer"))?;
    Ok(rest
        .split('/')
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect())
}

/// One RFC 6902 operation (add, remove, replace, test) on `doc`.
fn json_patch(doc: &mut Value, op: &cr::JsonPatchOp) -> Result<(), String> {
    use cr::JsonPatchOpKind::*;
    let mut tokens = pointer_tokens(&op.path)?;
    let last = tokens.pop().ok_or("empty path")?;
    let mut parent = &mut *doc;
    for t in &tokens {
        parent = match parent {
            Value::Object(m) => m.get_mut(t).ok_or_else(|| format!("no {t}"))?,
            Value::Array(a) => {
                let i: usize = t.parse().map_err(|_| format!("{t}: not an index"))?;
                a.get_mut(i).ok_or_else(|| format!("no index {i}"))?
            }
            _ => return Err(format!("{t}: not in a map or list")),
        };
    }
    let value = || op.value.clone().ok_or("no value".to_owned());
    match (parent, &op.op) {
        (Value::Object(m), Add) => {
            m.insert(last, value()?);
        }
        (Value::Object(m), Replace) => {
            let slot = m.get_mut(&last).ok_or_else(|| format!("no {last}"))?;
            *slot = value()?;
        }
        (Value::Object(m), Remove) => {
            m.remove(&last).ok_or_else(|| format!("no {last}"))?;
        }
        (Value::Object(m), Test) => {
            if m.get(&last) != Some(&value()?) {
                return Err(format!("test failed: {last} is {:?}", m.get(&last)));
            }
        }
        (Value::Array(a), Add) if last == "-" => a.push(value()?),
        (Value::Array(a), kind) => {
            let i: usize = last.parse().map_err(|_| format!("{last}: not an index"))?;
            match kind {
                Add if i <= a.len() => a.insert(i, value()?),
                Replace if i < a.len() => a[i] = value()?,
                Remove if i < a.len() => drop(a.remove(i)),
                Test if a.get(i) == Some(&value()?) => {}
                _ => return Err(format!("{kind:?} at index {i} of {} items", a.len())),
            }
        }
        (_, _) => return Err("the parent is not a map or list".into()),
    }
    Ok(())
}

pub(crate) fn key(doc: &Doc) -> (String, String, String) {
    (
        doc.kind().to_owned(),
        doc.namespace().unwrap_or("").to_owned(),
        doc.name().to_owned(),
    )
}

/// `kubectl kustomize` of the overlay, if kubectl is installed.
pub(crate) fn kubectl_render(dir: &Path) -> Option<Vec<Doc>> {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(dir)
        .output()
        .ok()?;
    assert!(
        out.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    Some(parse_yaml(
        &String::from_utf8(out.stdout).expect("UTF-8"),
        &format!("kubectl kustomize {}", rel(dir)),
    ))
}
