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

{{/* The image reference: repository@digest when a digest is given (immutable), else :tag. */}}
{{- define "mnemoflow.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository .Values.image.tag -}}
{{- end -}}
{{- end -}}

{{/* MNEMOFLOW_GRACEFUL_SHUTDOWN_S of a role: the longest legitimate activity + drain margin. */}}
{{- define "mnemoflow.gracefulSeconds" -}}
{{- $v := .root.Values -}}
{{- $bound := ternary $v.llm.timeoutSeconds $v.stores.timeoutSeconds (eq .role "llm") -}}
{{- add (int $bound) (int $v.shutdown.drainMarginSeconds) -}}
{{- end -}}

{{/* terminationGracePeriodSeconds of a role: its drain + the time to close and exit. */}}
{{- define "mnemoflow.terminationSeconds" -}}
{{- add (include "mnemoflow.gracefulSeconds" .) (int .root.Values.shutdown.exitMarginSeconds) -}}
{{- end -}}

{{/* The LLM role's replica ceiling: pods beyond what the rate limit keeps busy add nothing.
     ceil(activitiesPerSecond * activitySeconds / maxConcurrentActivities), kept within
     [minReplicas, maxReplicas]; without a rate limit, maxReplicas. */}}
{{- define "mnemoflow.maxReplicas" -}}
{{- $w := .worker -}}
{{- $max := int $w.autoscaling.maxReplicas -}}
{{- if and (eq $w.role "llm") $w.activitiesPerSecond -}}
{{- $busy := ceil (divf (mulf $w.activitiesPerSecond $w.autoscaling.activitySeconds) $w.maxConcurrentActivities) | int -}}
{{- $max = max (min $max $busy) (int $w.autoscaling.minReplicas) -}}
{{- end -}}
{{- $max -}}
{{- end -}}

{{/* The `to:` peers of one egress destination: its in-cluster selectors and its CIDRs. */}}
{{- define "mnemoflow.egressPeers" -}}
{{- $d := .dest -}}
{{- if or $d.namespaceSelector $d.podSelector }}
- {{- with $d.namespaceSelector }}
  namespaceSelector:
    matchLabels:
      {{- toYaml . | nindent 6 }}
  {{- end }}
  {{- with $d.podSelector }}
  podSelector:
    matchLabels:
      {{- toYaml . | nindent 6 }}
  {{- end }}
{{- end }}
{{- range $d.cidrs }}
- ipBlock:
    cidr: {{ . }}
    {{- with $d.except }}
    except:
      {{- toYaml . | nindent 6 }}
    {{- end }}
{{- end }}
{{- if not (or $d.namespaceSelector $d.podSelector $d.cidrs) }}
{{- fail (printf "networkPolicy.egress.%s needs a namespaceSelector/podSelector or cidrs" .name) }}
{{- end }}
{{- end -}}
