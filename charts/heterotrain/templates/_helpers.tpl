{{/*
Chart name, truncated to the 63 characters a label value may hold.
*/}}
{{- define "heterotrain.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified app name: <release>-<chart> unless the release name already contains the chart name.
*/}}
{{- define "heterotrain.fullname" -}}
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
chart label value: <name>-<version>, "+" is not allowed in label values.
*/}}
{{- define "heterotrain.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Selector labels: the stable subset used in selectors (never change after install).
*/}}
{{- define "heterotrain.selectorLabels" -}}
app.kubernetes.io/name: {{ include "heterotrain.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Common labels on every object of the chart (app.kubernetes.io/* recommended labels).
*/}}
{{- define "heterotrain.labels" -}}
helm.sh/chart: {{ include "heterotrain.chart" . }}
{{ include "heterotrain.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: heterotrain
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Labels of one component: common labels plus app.kubernetes.io/component.
Usage: include "heterotrain.componentLabels" (dict "ctx" $ "component" "operator")
*/}}
{{- define "heterotrain.componentLabels" -}}
{{ include "heterotrain.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/*
Name of the operator's ServiceAccount.
*/}}
{{- define "heterotrain.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "heterotrain.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Operator image reference: repository:tag or repository@digest.
*/}}
{{- define "heterotrain.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/*
Namespaces the operator watches when watch.scope is Namespaced (default: the release namespace).
Returns a list rendered as YAML; use with fromYamlArray.
*/}}
{{- define "heterotrain.watchNamespaces" -}}
{{- if .Values.watch.namespaces }}
{{- toYaml .Values.watch.namespaces }}
{{- else }}
{{- toYaml (list .Release.Namespace) }}
{{- end }}
{{- end }}

{{/*
True ("true") when the operator watches the whole cluster.
*/}}
{{- define "heterotrain.clusterWide" -}}
{{- if eq .Values.watch.scope "Cluster" }}true{{- end }}
{{- end }}

{{/*
Name of the Grafana dashboards ConfigMap.
*/}}
{{- define "heterotrain.dashboardsName" -}}
{{- printf "%s-dashboards" (include "heterotrain.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
HTJ_GPU_PRICES from operator.gpuPricesPerHour: "type=price,type=price" (sorted by type).
*/}}
{{- define "heterotrain.gpuPrices" -}}
{{- $pairs := list -}}
{{- range $type, $price := . -}}
{{- $pairs = append $pairs (printf "%s=%v" $type $price) -}}
{{- end -}}
{{- join "," $pairs -}}
{{- end -}}
