{{/* The release's full name, the prefix of every object's name. */}}
{{- define "gpuportal.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "gpuportal.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The labels that select one process's pods: call with (dict "root" $ "component" "web"). */}}
{{- define "gpuportal.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "gpuportal.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "gpuportal.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "gpuportal.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "gpuportal.host" -}}
{{- required "portal.host must name the portal's host (e.g. portal.example.org)" .Values.portal.host -}}
{{- end -}}

{{- define "gpuportal.proxyApiUrl" -}}
{{- printf "http://%s-proxy-api:%d" (include "gpuportal.fullname" .) (int .Values.proxy.apiPort) -}}
{{- end -}}

{{/* A variable from an existing Secret: (dict "name" "SECRET_KEY" "secret" .Values.secrets.secretKey "what" "...") */}}
{{- define "gpuportal.secretEnv" -}}
- name: {{ .name }}
  valueFrom:
    secretKeyRef:
      name: {{ required (printf "%s: name an existing Secret" .what) .secret.existingSecret }}
      key: {{ .secret.key }}
{{- end -}}

{{/* The environment every process of the portal gets (docs/configuration.md). */}}
{{- define "gpuportal.env" -}}
{{- $host := include "gpuportal.host" . -}}
- name: PORTAL_ENV
  value: production
- name: PORTAL_DATA_DIR
  value: /var/lib/gpuportal
- name: ALLOWED_HOSTS
  value: {{ $host | quote }}
- name: CSRF_TRUSTED_ORIGINS
  value: {{ printf "https://%s" $host | quote }}
- name: PORTAL_PUBLIC_URL
  value: {{ printf "https://%s" $host | quote }}
{{- /* Notebook servers reach the portal through the Ingress, over HTTPS, as browsers do. */}}
- name: PORTAL_INTERNAL_URL
  value: {{ printf "https://%s" $host | quote }}
- name: PORTAL_NOTEBOOK_DOMAIN
  value: {{ required "portal.notebookDomain must name the notebooks' wildcard domain (e.g. apps.example.org)" .Values.portal.notebookDomain | quote }}
- name: PORTAL_PROXY_API_URL
  value: {{ include "gpuportal.proxyApiUrl" . | quote }}
- name: SECURE_PROXY_SSL_HEADER
  value: "true"
- name: PORTAL_TRUSTED_PROXIES
  value: {{ .Values.portal.trustedProxies | quote }}
- name: PORTAL_WEB_FORWARDED_ALLOW_IPS
  value: {{ .Values.portal.trustedProxies | quote }}
- name: DATABASE_POOL_MAX
  value: {{ .Values.database.poolMax | quote }}
- name: PORTAL_SCHEDULER_INTERVAL_S
  value: {{ .Values.scheduler.intervalSeconds | quote }}
{{- with .Values.redis.prefix }}
- name: PORTAL_REDIS_PREFIX
  value: {{ . | quote }}
{{- end }}
{{ include "gpuportal.secretEnv" (dict "name" "SECRET_KEY" "secret" .Values.secrets.secretKey "what" "secrets.secretKey") }}
{{ include "gpuportal.secretEnv" (dict "name" "PORTAL_PROXY_AUTH_TOKEN" "secret" .Values.secrets.proxyToken "what" "secrets.proxyToken") }}
{{ include "gpuportal.secretEnv" (dict "name" "DATABASE_URL" "secret" .Values.database "what" "database") }}
{{ include "gpuportal.secretEnv" (dict "name" "REDIS_URL" "secret" .Values.redis "what" "redis") }}
{{- if .Values.secrets.metricsToken.existingSecret }}
{{ include "gpuportal.secretEnv" (dict "name" "PORTAL_METRICS_TOKEN" "secret" .Values.secrets.metricsToken "what" "secrets.metricsToken") }}
{{- end }}
{{- with .Values.oidc }}
{{- if .issuer }}
- name: PORTAL_OIDC_ISSUER
  value: {{ .issuer | quote }}
- name: PORTAL_OIDC_CLIENT_ID
  value: {{ required "oidc.clientId is needed with oidc.issuer" .clientId | quote }}
{{ include "gpuportal.secretEnv" (dict "name" "PORTAL_OIDC_CLIENT_SECRET" "secret" . "what" "oidc") }}
{{- with .adminGroups }}
- name: PORTAL_OIDC_ADMIN_GROUPS
  value: {{ . | quote }}
{{- end }}
{{- with .breakGlassAdmin }}
- name: PORTAL_BREAK_GLASS_ADMIN
  value: {{ . | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- with .Values.smtp }}
{{- if .host }}
- name: EMAIL_HOST
  value: {{ .host | quote }}
- name: EMAIL_PORT
  value: {{ .port | quote }}
- name: EMAIL_USE_TLS
  value: {{ .useTls | quote }}
{{- with .user }}
- name: EMAIL_HOST_USER
  value: {{ . | quote }}
{{- end }}
{{- with .from }}
- name: DEFAULT_FROM_EMAIL
  value: {{ . | quote }}
{{- end }}
{{- if .existingSecret }}
{{ include "gpuportal.secretEnv" (dict "name" "EMAIL_HOST_PASSWORD" "secret" . "what" "smtp") }}
{{- end }}
{{- end }}
{{- end }}
{{- range $name, $value := .Values.portal.env }}
- name: {{ $name }}
  value: {{ $value | quote }}
{{- end }}
{{- end -}}

{{/* The pod-level settings every process shares: its ServiceAccount, security, placement. */}}
{{- define "gpuportal.podSpec" -}}
serviceAccountName: {{ include "gpuportal.serviceAccountName" . }}
automountServiceAccountToken: true
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
volumes:
  - name: data
    emptyDir: {}
  - name: tmp
    emptyDir: {}
{{- end -}}

{{/* A portal container's image, security and writable directories; the caller adds name, args, env. */}}
{{- define "gpuportal.container" -}}
image: {{ include "gpuportal.image" . }}
imagePullPolicy: {{ .Values.image.pullPolicy }}
securityContext:
  {{- toYaml .Values.securityContext | nindent 2 }}
volumeMounts:
  - name: data
    mountPath: /var/lib/gpuportal
  - name: tmp
    mountPath: /tmp
{{- end -}}
