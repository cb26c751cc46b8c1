FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY fleet fleet
COPY scheduler scheduler
COPY workers workers
COPY fleetctl fleetctl
RUN pip install --no-cache-dir .
COPY manage.py ./
COPY templates templates
COPY static static
ENV FLEET_VAR_DIR=/var/lib/fleet
# The account the agent runs jobs as (FLEET_JOB_USER), and the 0711 root of their scratch
# directories; the agent itself runs as root so it can switch to it.
RUN useradd --system --user-group --home-dir /var/lib/fleet-job --create-home \
      --shell /usr/sbin/nologin fleet-job \
    && mkdir -m 0711 /var/lib/fleet-scratch
ENV FLEET_JOB_SCRATCH_DIR=/var/lib/fleet-scratch
