// Polls a page's live fragment with If-None-Match while something in it runs
// (an element marked data-running="yes"); the server answers 304 when nothing
// changed, so idle tabs cost little, and polling stops once nothing runs.
(function () {
  "use strict";
  var box = document.getElementById("live");
  if (!box) { return; }
  var etag = null;
  // A list (many workflows, a store read each) asks less often than one workflow.
  var delayMs = Number(box.dataset.intervalMs) || 1000;
  function running() { return box.querySelector('[data-running="yes"]') !== null; }
  function poll() {
    var headers = etag ? { "If-None-Match": etag } : {};
    fetch(box.dataset.live, { headers: headers, credentials: "same-origin" })
      .then(function (response) {
        if (response.status === 200) {
          etag = response.headers.get("ETag");
          return response.text().then(function (html) { box.innerHTML = html; });
        }
        return null;
      })
      .catch(function () { return null; })
      .then(function () { if (running()) { setTimeout(poll, delayMs); } });
  }
  if (running()) { setTimeout(poll, delayMs); }
}());
