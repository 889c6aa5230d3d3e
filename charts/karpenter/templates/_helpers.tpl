{{/*
Name of the chart, or nameOverride. Kubernetes names are at most 63 characters.
*/}}
{{- define "karpenter.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name of the release's objects: fullnameOverride, else the release name
(with the chart name appended unless the release name already contains it).
*/}}
{{- define "karpenter.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Chart name and version, for the helm.sh/chart label.
*/}}
{{- define "karpenter.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels of every object.
*/}}
{{- define "karpenter.labels" -}}
helm.sh/chart: {{ include "karpenter.chart" . }}
{{ include "karpenter.selectorLabels" . }}
{{- if .Chart.AppVersion }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.additionalLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Labels that select the controller pods (Deployment selector, Service,
PodDisruptionBudget, default affinity and spread selectors).
*/}}
{{- define "karpenter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "karpenter.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Name of the ServiceAccount the controller runs as.
*/}}
{{- define "karpenter.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "karpenter.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Controller image reference: repository:tag, with @digest when a digest is set.
The tag defaults to the chart's appVersion.
*/}}
{{- define "karpenter.controller.image" -}}
{{- $image := .Values.controller.image }}
{{- $ref := printf "%s:%s" $image.repository (default .Chart.AppVersion $image.tag | toString) }}
{{- if $image.digest }}
{{- $ref = printf "%s@%s" $ref $image.digest }}
{{- end }}
{{- $ref }}
{{- end }}

{{/*
The cluster name, which the controller cannot work without. Like upstream's
chart, the value may be a template ({{ .Release.Name }}).
*/}}
{{- define "karpenter.clusterName" -}}
{{- required "settings.clusterName is required: set it to the name of your EKS cluster (--set settings.clusterName=<name> or in your values file)" (tpl (toString (.Values.settings.clusterName | default "")) .) }}
{{- end }}

{{/*
Name of the controller container.
*/}}
{{- define "karpenter.controller.containerName" -}}
{{- .Values.controller.containerName | default "controller" -}}
{{- end -}}

{{/*
One environment variable of a setting, as upstream's chart renders it: left
out when the value is false, 0 or empty, else the value as a string, run
through tpl. Takes a dict: name, value, root (the top-level context). The
entry comes on a new line, indented for the controller's `env` list.
*/}}
{{- define "karpenter.settingEnv" -}}
{{- with .value }}
{{- printf "- name: %s\n  value: %s" $.name (tpl (toString .) $.root | quote) | nindent 12 }}
{{- end }}
{{- end }}

{{/*
FEATURE_GATES value: Name=bool pairs joined by commas, in the order of
upstream's chart. Only the gates this chart knows are passed; others (e.g.
the graduated `drift`) are ignored.
*/}}
{{- define "karpenter.featureGates" -}}
{{- $gates := .Values.settings.featureGates | default dict }}
{{- $known := list
  (list "ReservedCapacity" "reservedCapacity" true)
  (list "SpotToSpotConsolidation" "spotToSpotConsolidation" false)
  (list "NodeRepair" "nodeRepair" false)
  (list "NodeOverlay" "nodeOverlay" false)
  (list "StaticCapacity" "staticCapacity" false)
  (list "CapacityBuffer" "capacityBuffer" false) }}
{{- $pairs := list }}
{{- range $known }}
{{- $key := index . 1 }}
{{- $value := index . 2 }}
{{- if hasKey $gates $key }}
{{- $value = index $gates $key }}
{{- end }}
{{- $pairs = append $pairs (printf "%s=%t" (index . 0) (eq (toString $value) "true")) }}
{{- end }}
{{- join "," $pairs }}
{{- end }}

{{/*
Affinity with a labelSelector filled in on every pod (anti-)affinity term
that has none, selecting this release's controller pods. Works on a copy, so
.Values stays as given. Renders YAML.
*/}}
{{- define "karpenter.affinity" -}}
{{- $affinity := deepCopy .Values.affinity }}
{{- $selector := dict "matchLabels" (include "karpenter.selectorLabels" . | fromYaml) }}
{{- range $kind := list "podAffinity" "podAntiAffinity" }}
{{- with (index $affinity $kind) }}
{{- range (.requiredDuringSchedulingIgnoredDuringExecution | default list) }}
{{- if not .labelSelector }}
{{- $_ := set . "labelSelector" (deepCopy $selector) }}
{{- end }}
{{- end }}
{{- range (.preferredDuringSchedulingIgnoredDuringExecution | default list) }}
{{- if and .podAffinityTerm (not .podAffinityTerm.labelSelector) }}
{{- $_ := set .podAffinityTerm "labelSelector" (deepCopy $selector) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- toYaml $affinity }}
{{- end }}

{{/*
Topology spread constraints with a labelSelector filled in where none is
given, selecting this release's controller pods. Renders YAML.
*/}}
{{- define "karpenter.topologySpreadConstraints" -}}
{{- $constraints := deepCopy .Values.topologySpreadConstraints }}
{{- $selector := dict "matchLabels" (include "karpenter.selectorLabels" . | fromYaml) }}
{{- range $constraints }}
{{- if not .labelSelector }}
{{- $_ := set . "labelSelector" (deepCopy $selector) }}
{{- end }}
{{- end }}
{{- toYaml $constraints }}
{{- end }}

{{/*
Container securityContext: a hardened default with
controller.securityContext merged over it. An empty object among its fields
(upstream's values have `appArmorProfile: {}` and `seLinuxOptions: {}`) is
left out, as upstream's chart leaves it out.
*/}}
{{- define "karpenter.controller.securityContext" -}}
{{- $base := dict
  "runAsNonRoot" true
  "runAsUser" 65532
  "runAsGroup" 65532
  "readOnlyRootFilesystem" true
  "allowPrivilegeEscalation" false
  "capabilities" (dict "drop" (list "ALL"))
  "seccompProfile" (dict "type" "RuntimeDefault") }}
{{- $merged := mustMergeOverwrite $base (deepCopy (.Values.controller.securityContext | default dict)) }}
{{- range $key, $value := $merged }}
{{- if and (kindIs "map" $value) (empty $value) }}
{{- $_ := unset $merged $key }}
{{- end }}
{{- end }}
{{- toYaml $merged }}
{{- end }}
