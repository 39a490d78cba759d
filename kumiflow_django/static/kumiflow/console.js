// kumiflow-django's console: reload a page that shows something still moving
// (an active run, the overview) every few seconds, while its "auto-refresh"
// box is ticked and the reader is not in the middle of something (a payload
// opened, text selected, the tab hidden). The choice is remembered per page kind.
(function () {
  "use strict";
  function start() {
    var box = document.getElementById("kf-auto-refresh");
    if (!box) { return; }
    var seconds = parseInt(box.getAttribute("data-kf-refresh"), 10) || 10;
    var key = "kumiflow-auto-refresh:" + document.body.className.split(" ").filter(function (c) {
      return c.indexOf("model-") === 0 || c.indexOf("kf-") === 0;
    }).join(" ");
    try {
      if (window.localStorage.getItem(key) === "off") { box.checked = false; }
    } catch (e) { /* storage may be off */ }
    box.addEventListener("change", function () {
      try { window.localStorage.setItem(key, box.checked ? "on" : "off"); } catch (e) { /* ignore */ }
    });
    function busy() {
      if (document.hidden) { return true; }
      var selection = window.getSelection && window.getSelection();
      if (selection && String(selection).length > 0) { return true; }
      return document.querySelector(".kf-lines details[open], .kf-result details[open]") !== null;
    }
    window.setInterval(function () {
      if (box.checked && !busy()) { window.location.reload(); }
    }, seconds * 1000);
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
