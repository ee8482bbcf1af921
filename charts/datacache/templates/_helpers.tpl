{{- define "datacache.fullname" -}}{{ printf "%s-datacache" .Release.Name | trunc 63 | trimSuffix "-" }}{{- end }}
{{- define "datacache.image" -}}{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}{{- end }}
{{- define "datacache.labels" -}}
app.kubernetes.io/name: datacache
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}
{{- define "datacache.selector" -}}
app.kubernetes.io/name: datacache
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}
