/* Policy advisor: follow a run's progress (GET /api/v1/advisor/runs/<id>/ every 2 s while
 * the tab is visible) and show the run's page (?run=<id>) once it is done or has failed. */
(function () {
  "use strict";
  var box = document.querySelector("[data-advisor-run]");
  if (!box) return;
  var url = box.getAttribute("data-advisor-run");
  var bar = box.querySelector("progress");
  var status = box.querySelector("[data-advisor-status]");
  var busy = false;
  function poll() {
    if (busy || document.visibilityState !== "visible") return;
    busy = true;
    fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (run) {
        if (!run) { status.textContent = "Progress is unavailable right now; retrying."; return; }
        if (run.state === "done" || run.state === "failed") {
          // Load this run's page. Not reload(): where the page answers a POST (a start
          // refused while this run was in progress), reloading sends the form again and
          // starts another run.
          window.location.replace(window.location.pathname + "?run=" + encodeURIComponent(run.id));
          return;
        }
        bar.max = Math.max(run.total, 1);
        bar.value = run.done;
        bar.textContent = run.done + " of " + run.total;
        status.textContent = run.state === "queued"
          ? "queued: waiting for the control worker to take it"
          : run.state + ": " + run.done + " of " + (run.total || "?") + " candidates simulated";
      })
      .catch(function () { status.textContent = "Progress is unavailable right now; retrying."; })
      .then(function () { busy = false; });
  }
  setInterval(poll, 2000);
  document.addEventListener("visibilitychange", poll);
})();
