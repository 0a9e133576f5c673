{{- define "mnemoflow.fullname" -}}
{{- printf "%s-mnemoflow" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}

{{- define "mnemoflow.labels" -}}
app.kubernetes.io/name: mnemoflow
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "mnemoflow.selector" -}}
app.kubernetes.io/name: mnemoflow
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "mnemoflow.secretName" -}}
{{- default (include "mnemoflow.fullname" .) .Values.secret.existingSecret -}}
{{- end -}}
