{{- define "koordnode.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "koordnode.serviceAccountName" -}}
{{- default (include "koordnode.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "koordnode.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "koordnode.labels" -}}
{{ include "koordnode.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The keys the DaemonSet's mounts decide: the host's trees under /host. */}}
{{- define "koordnode.mountSettings" -}}
cgroup: {root: /host/sys/fs/cgroup}
procfs: {root: /host/proc}
sysfs: {root: /host/sys}
admin: {socket: /var/run/koordnode/admin.sock}
daemon: {state_dir: /var/lib/koordnode}
{{- end -}}

{{/* koordnode.toml from .Values.settings and the mounts' keys: one [table] per key of the map,
     each value as JSON (a TOML string, number, boolean or array of those). */}}
{{- define "koordnode.toml" -}}
{{- $settings := mergeOverwrite (deepCopy .Values.settings) (include "koordnode.mountSettings" . | fromYaml) -}}
{{- if ne (toString (dig "runtime" "mode" "nri" $settings)) "nri" -}}
{{- fail "settings.runtime.mode: a DaemonSet runs koordnode in NRI mode only (proxy mode needs kubelet's flags changed: use the .deb/.rpm)" -}}
{{- end -}}
# koordnode.toml rendered by the koordnode chart: edit the chart's values, not this ConfigMap.
{{- range $table, $keys := $settings }}
{{- if not (kindIs "map" $keys) }}
{{- fail (printf "settings.%s: expected a table of keys, got %v" $table $keys) }}
{{- end }}

[{{ $table }}]
{{- range $key, $value := $keys }}
{{- if kindIs "map" $value }}
{{- fail (printf "settings.%s.%s: a table inside a table: name it settings.\"%s.%s\" instead" $table $key $table $key) }}
{{- end }}
{{ $key }} = {{ toJson $value }}
{{- end }}
{{- end }}
{{- end -}}
