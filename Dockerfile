FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY fleet fleet
COPY scheduler scheduler
COPY workers workers
RUN pip install --no-cache-dir . gunicorn
COPY manage.py ./
COPY templates templates
COPY static static
ENV FLEET_VAR_DIR=/var/lib/fleet
