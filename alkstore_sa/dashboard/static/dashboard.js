// alkstore dashboard: refresh the queues page's count cells in place from api/counts.
(function () {
  "use strict";
  var INTERVAL_MS = 5000;
  var table = document.getElementById("queues");
  if (!table || !window.fetch) { return; }
  var countsUrl = table.getAttribute("data-counts-url");

  function formatAge(seconds) {
    if (seconds === null || seconds === undefined) { return "-"; }
    var s = Math.floor(seconds);
    function pad(n) { return (n < 10 ? "0" : "") + n; }
    if (s < 60) { return seconds.toFixed(1) + "s"; }
    if (s < 3600) { return Math.floor(s / 60) + "m " + pad(s % 60) + "s"; }
    if (s < 86400) { return Math.floor(s / 3600) + "h " + pad(Math.floor(s % 3600 / 60)) + "m"; }
    return Math.floor(s / 86400) + "d " + pad(Math.floor(s % 86400 / 3600)) + "h";
  }

  // Queue names are user data: only the answer's own keys name queues. A plain lookup
  // would find what every object inherits ("constructor", "__proto__", "toString") for a
  // queue of that name that left the counts.
  var own = Object.prototype.hasOwnProperty;
  function countsOf(queues, name) {
    return queues && own.call(queues, name) ? queues[name] : null;
  }

  function apply(data) {
    var rows = table.querySelectorAll("tr[data-queue]");
    for (var i = 0; i < rows.length; i++) {
      var row = rows[i];
      var numbers = countsOf(data.queues, row.getAttribute("data-queue"));
      var cells = row.querySelectorAll("td[data-count]");
      for (var j = 0; j < cells.length; j++) {
        var state = cells[j].getAttribute("data-count");
        var value = numbers ? numbers[state] : 0;
        if (cells[j].textContent !== String(value)) { cells[j].textContent = String(value); }
      }
      var ageCell = row.querySelector("td[data-age]");
      if (ageCell) { ageCell.textContent = numbers && numbers.ready ? formatAge(numbers.oldest_ready_age) : "-"; }
    }
    table.setAttribute("data-refreshed", String(Date.now()));
  }

  // One request in flight at most; a slow read (a huge backlog) spaces the next one out,
  // so an open tab never keeps the database busy more than a tenth of the time.
  function refresh() {
    var started = Date.now();
    fetch(countsUrl, { credentials: "same-origin", headers: { "Accept": "application/json" } })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (data) { if (data) { apply(data); } })
      .catch(function () { /* a missed refresh is retried at the next tick */ })
      .then(function () {
        if (document.hidden) { document.addEventListener("visibilitychange", resume); return; }
        window.setTimeout(refresh, Math.max(INTERVAL_MS, 10 * (Date.now() - started)));
      });
  }

  function resume() {
    if (document.hidden) { return; }
    document.removeEventListener("visibilitychange", resume);
    refresh();
  }
  window.setTimeout(refresh, INTERVAL_MS);
}());
