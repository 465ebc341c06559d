{{/*
Names are fixed, not derived from the release name: the CRDs, the webhook configuration
"portalloc" and its CA Secret are cluster-wide or known to the watcher by name, so there is one
release per cluster. Labels are those of deploy/, which is rendered from this chart.
*/}}

{{- define "portalloc.labels" -}}
app.kubernetes.io/name: kubectl-portalloc
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
{{- end }}

{{- define "portalloc.selectorLabels" -}}
app.kubernetes.io/name: kubectl-portalloc
app.kubernetes.io/component: watcher
{{- end }}

{{- define "portalloc.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default (printf "v%s" .Chart.AppVersion) }}
{{- end }}

{{/* The watcher's rights on namespaced objects: in every namespace, or in the watched one. */}}
{{- define "portalloc.namespacedRules" -}}
- apiGroups: [portalloc.dev]
  resources: [portallocations]
  verbs: [get, list, watch, update]
- apiGroups: [portalloc.dev]
  resources: [portallocations/status]
  verbs: [get, update]
{{- end }}

{{/* Events on what the watcher did (allocated, released, refused, repaired): kube-runtime's
recorder creates them through events.k8s.io/v1 and patches a repeated one into a series; core
"" for the same objects through the older API. A watcher of every namespace also says repairs
and full pools on the PortPools, whose Events go to namespace default. */}}
{{- define "portalloc.eventRules" -}}
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- end }}

{{/* Nodes, read as metadata only: the watcher of every namespace counts the nodes each pool
with spec.followNodes may use (status.nodes). Read only; without it such pools use copy 0 only,
unless a client allowed to list nodes counts them at allocation. */}}
{{- define "portalloc.nodeRules" -}}
- apiGroups: [""]
  resources: [nodes]
  verbs: [get, list, watch]
{{- end }}

{{/* The watcher's Lease (--leader-elect), per watched scope as the watcher names it. */}}
{{- define "portalloc.leaseName" -}}
{{- if .Values.watchNamespace -}}
portalloc-watcher-{{ .Values.watchNamespace }}
{{- else -}}
portalloc-watcher
{{- end -}}
{{- end }}

{{- define "portalloc.configMapRules" -}}
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, create, patch]
{{- end }}

{{/* The watcher's rights on cluster-scoped objects: pools and their shards. */}}
{{- define "portalloc.clusterRules" -}}
- apiGroups: [portalloc.dev]
  resources: [portpools]
  verbs: [get, list, watch]
{{- if not .Values.watchNamespace }}
# The usage summary on each pool's status (kubectl get portpools: Allocated, Free, Largest Free
# Run, Counted), written when it changes; never a pool's spec. Only a watcher of every namespace
# keeps it; without the right it allocates all the same and says at start that it keeps none.
- apiGroups: [portalloc.dev]
  resources: [portpools/status]
  verbs: [update]
{{- end }}
# update and delete: beyond a user's rights. Update on a shard makes the watcher a pool
# administrator to the tenancy policy, so its batches and repair pass may carry a pool's new spec
# to its shards and free any tenant's leaked entries; delete, for the repair pass, which removes
# the shards a deleted pool of the same name left behind (only those: a UID precondition).
- apiGroups: [portalloc.dev]
  resources: [portpoolshards]
  verbs: [get, list, watch, create, update, delete]
- apiGroups: [portalloc.dev]
  resources: [portpoolshards/status]
  verbs: [get, update]
{{- end }}
