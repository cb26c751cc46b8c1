"""Settings the test suite runs with: production's (DEBUG off), with a fixed secret key and
plain-http cookies, since the browser tests' live server speaks plain http.

The key goes into the environment, so the processes tests start (a control worker, a
manage.py command) share it.
"""

import os

os.environ.setdefault("SECRET_KEY", "fleet-tests-only-not-a-secret-" + "k" * 40)

from fleet.settings import *  # noqa: E402, F403

SESSION_COOKIE_SECURE = False
CSRF_COOKIE_SECURE = False
SECURE_SSL_REDIRECT = False
SECURE_HSTS_SECONDS = 0
ALLOWED_HOSTS = ["testserver", "localhost", "127.0.0.1"]
